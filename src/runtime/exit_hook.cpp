#include "runtime/exit_hook.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "runtime/worker_stream.h"

namespace kiln::runtime {

namespace {

struct ExitRegistry {
  std::mutex mutex;
  std::vector<WorkerStream*> streams;
  bool exited = false;
};

// Never destroyed: the hook and late stream destructors may run after other statics are gone.
ExitRegistry& exit_registry() {
  static ExitRegistry* registry = new ExitRegistry;
  return *registry;
}

void run_exit_hook() {
  ExitRegistry& r = exit_registry();
  // Held throughout so a stream cannot be destroyed while it is being shut down.
  std::lock_guard lock(r.mutex);
  if (r.exited) return;
  r.exited = true;
  for (WorkerStream* s : r.streams) s->shutdown();
}

}  // namespace

void arm_exit_hook() {
  // A failed registration (out of memory) leaves the earlier registrations in place; there is no better
  // recovery at exit than that.
  (void)std::atexit(run_exit_hook);
}

void register_for_exit(WorkerStream* stream) {
  ExitRegistry& r = exit_registry();
  std::lock_guard lock(r.mutex);
  r.streams.push_back(stream);
}

void unregister_for_exit(WorkerStream* stream) {
  ExitRegistry& r = exit_registry();
  std::lock_guard lock(r.mutex);
  r.streams.erase(std::remove(r.streams.begin(), r.streams.end(), stream), r.streams.end());
}

}  // namespace kiln::runtime
