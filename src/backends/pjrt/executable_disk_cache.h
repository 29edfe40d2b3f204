// Compiled PJRT executables on disk, so that a second process compiles nothing it compiled before: each
// entry is Executable::serialize()'s bytes under the Kiln cache folder (core/cache_dir.h) in
// pjrt-executables/, named by a hash of its key — the plugin's platform name and version, the PJRT C API
// version and the module text. The entry holds the whole key too and is used only when it matches exactly, so
// neither a hash collision nor another plugin's build can load the wrong program. Entries are written
// atomically (io/atomic_file.h); a corrupt, truncated or unloadable one is reported with a warning and
// recompiled (and rewritten). Like the CPU JIT's kernel cache, it lives wherever KILN_CACHE_DIR (else
// XDG_CACHE_HOME/kiln, else ~/.cache/kiln) says, and is off only when none of them is set.
#pragma once

#include <memory>
#include <string>

#include "backends/pjrt/pjrt_client.h"

namespace kiln::pjrt {

class ExecutableDiskCache {
 public:
  // `folder`: where entries live ("" turns the disk cache off).
  explicit ExecutableDiskCache(std::string folder);
  // cache_dir()/pjrt-executables, or off when cache_dir() is "".
  static ExecutableDiskCache from_environment();

  bool enabled() const { return !folder_.empty(); }
  const std::string& folder() const { return folder_; }

  // The key of `module_text` compiled by `client`'s plugin.
  static std::string key_of(const Client& client, const std::string& module_text);
  // The entry's path for `key`.
  std::string path_of(const std::string& key) const;

  enum class Lookup { Hit, Absent, Rejected };
  // The executable stored for `key`, loaded on `client`; null with `*result` Absent (no entry) or Rejected
  // (an entry that is corrupt, truncated, of another key or that the plugin refused: warned about).
  std::shared_ptr<Executable> load(Client& client, const std::string& key, Lookup* result) const;
  // Stores `executable` for `key`; a failure to write is a warning (the process goes on compiling).
  void store(const Executable& executable, const std::string& key) const;

 private:
  std::string folder_;
};

}  // namespace kiln::pjrt
