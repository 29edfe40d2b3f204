// A file that appears at its destination complete or not at all. Bytes go to a temporary file in the same
// directory (so the final rename stays on one filesystem and is atomic); commit() flushes it to disk and
// renames it into place. If the object dies uncommitted (an error anywhere), the temporary file is removed,
// so a failed write never leaves a half-written file behind, nor clobbers an existing good one. The temporary
// file is also registered for removal by the signal handlers (kiln/core/signals.h), and commit() refuses to
// publish it once a stop has been requested: an interrupted run writes nothing.
#pragma once

#include <cstddef>
#include <string>

namespace kiln::io {

class AtomicFile {
 public:
  // Creates the temporary file next to `path`; throws kiln::Error naming `path` when that is impossible
  // (the directory is missing or not writable, `path` is a directory or another non-regular file, such as a
  // device, that a rename would replace).
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes, retrying short writes; throws naming the destination (disk full, file too large, ...).
  void write(const void* data, size_t size);
  // fsync, close, rename onto the destination, and fsync the directory so the rename itself is durable.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  void discard() noexcept;

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  int signal_slot_ = -1;
  bool committed_ = false;
};

}  // namespace kiln::io
