#include "backends/pjrt/executable_cache.h"

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "backends/pjrt/executable_disk_cache.h"
#include "kiln/core/bytes.h"
#include "kiln/core/log.h"

namespace kiln::pjrt {

namespace {

using Key = std::pair<const Client*, std::string>;

struct Cache {
  std::mutex mutex;
  std::map<Key, std::shared_ptr<Executable>> executables;
  std::set<Key> reported_hits;  // executables whose first memory hit was logged
  std::atomic<int64_t> compiles{0}, hits{0}, disk_hits{0}, disk_rejected{0};
};
Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: executables outlive the statics that run them at exit
  return *c;
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// The text compiled and keyed: a multi-replica module ends with a comment naming its devices, so the
// memory and disk caches tell placements apart (MLIR ignores the comment).
std::string placed_text(const std::string& module_text, const std::vector<int>& replica_devices) {
  if (replica_devices.empty()) return module_text;
  std::string text = module_text + "\n// replicas on devices";
  for (const int d : replica_devices) text += " " + std::to_string(d);
  return text + "\n";
}

// ", 16.0 KiB of scratch per run" when the plugin reports it (Executable::scratch_bytes).
std::string scratch_note(const Executable& executable) {
  const std::optional<int64_t> scratch = executable.scratch_bytes();
  return scratch ? ", " + format_bytes(*scratch) + " of scratch per run" : std::string();
}

}  // namespace

std::shared_ptr<Executable> cached_executable(Client& client, const std::string& text,
                                              const std::string& what,
                                              const std::vector<int>& replica_devices,
                                              const LowerFor& lower_for) {
  const std::string module_text = placed_text(text, replica_devices);
  const int replicas = replica_devices.empty() ? 1 : static_cast<int>(replica_devices.size());
  Cache& c = cache();
  Key key{&client, module_text};
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.executables.find(key);
    if (it != c.executables.end()) {
      ++c.hits;
      if (log_enabled("compile") && c.reported_hits.insert(key).second)
        log("compile", "memory cache hit for " + what + " (later hits of this executable are only counted)");
      return it->second;
    }
  }
  // Loaded or compiled outside the lock: two threads may do it for the same text once each, and the first
  // stored wins.
  const auto start = std::chrono::steady_clock::now();
  const ExecutableDiskCache disk = ExecutableDiskCache::from_environment();
  const std::string disk_key = disk.enabled() ? ExecutableDiskCache::key_of(client, module_text) : "";
  ExecutableDiskCache::Lookup lookup = ExecutableDiskCache::Lookup::Absent;
  std::shared_ptr<Executable> made = disk.load(client, disk_key, &lookup);
  if (made && !replica_devices.empty() && made->devices() != replica_devices) {
    // A plugin that forgot the device assignment on deserialization: compile again rather than run replicas
    // on the wrong devices.
    made = nullptr;
    lookup = ExecutableDiskCache::Lookup::Rejected;
  }
  if (lookup == ExecutableDiskCache::Lookup::Rejected) ++c.disk_rejected;
  if (made) {
    ++c.disk_hits;
    if (log_enabled("compile")) {
      std::ostringstream msg;
      msg << "disk cache hit for " << what << ": loaded " << disk.path_of(disk_key) << " in "
          << ms_since(start) << " ms" << scratch_note(*made);
      log("compile", msg.str());
    }
  } else {
    made = client.compile(module_text, replicas, 1, replica_devices);
    ++c.compiles;
    const double compile_ms = ms_since(start);
    disk.store(*made, disk_key);
    if (log_enabled("compile")) {
      std::ostringstream msg;
      msg << "compiled a " << client.platform_name() << " executable for " << what << " in " << compile_ms
          << " ms" << scratch_note(*made);
      if (disk.enabled()) msg << " (saved to " << disk.path_of(disk_key) << ")";
      log("compile", msg.str());
    }
  }
  cross_compile(client.platform_name(), text, lower_for, replicas, what);
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.executables.emplace(std::move(key), std::move(made)).first->second;
}

ExecutableCacheStats executable_cache_stats() {
  Cache& c = cache();
  return {c.compiles.load(), c.hits.load(), c.disk_hits.load(), c.disk_rejected.load()};
}

void clear_executable_memory_cache() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.executables.clear();
  c.reported_hits.clear();
}

}  // namespace kiln::pjrt
