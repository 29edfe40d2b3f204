#include "backends/pjrt/executable_cache.h"

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <sstream>

#include "kiln/core/log.h"

namespace kiln::pjrt {

namespace {

struct Cache {
  std::mutex mutex;
  std::map<std::pair<const Client*, std::string>, std::shared_ptr<Executable>> executables;
  std::atomic<int64_t> compiles{0}, hits{0};
};
Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: executables outlive the statics that run them at exit
  return *c;
}

}  // namespace

std::shared_ptr<Executable> cached_executable(Client& client, const std::string& module_text,
                                              const std::string& what) {
  Cache& c = cache();
  std::pair<const Client*, std::string> key{&client, module_text};
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.executables.find(key);
    if (it != c.executables.end()) {
      ++c.hits;
      return it->second;
    }
  }
  // Compiled outside the lock: two threads may compile the same text once each, and the first stored wins.
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<Executable> made = client.compile(module_text);
  ++c.compiles;
  if (log_enabled("compile")) {
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::ostringstream msg;
    msg << "compiled a " << client.platform_name() << " executable for " << what << " in " << ms << " ms";
    log("compile", msg.str());
  }
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.executables.emplace(std::move(key), std::move(made)).first->second;
}

ExecutableCacheStats executable_cache_stats() {
  return {cache().compiles.load(), cache().hits.load()};
}

}  // namespace kiln::pjrt
