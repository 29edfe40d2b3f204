#include "runtime/exit_hook.h"

#include <pthread.h>
#include <unistd.h>

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
  bool exited = false;  // the main thread's exit or the atexit hook has stopped every stream
};

void before_fork();
void after_fork_in_parent();
void after_fork_in_child();

// Never destroyed: thread exits, the hook and late stream destructors may come after other statics are gone.
ExitRegistry& exit_registry() {
  static ExitRegistry* registry = [] {
    auto* r = new ExitRegistry;
    // A failure (out of memory) leaves fork unhandled, which only matters to a process that forks.
    (void)pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
    return r;
  }();
  return *registry;
}

void before_fork() {
  ExitRegistry& r = exit_registry();
  r.mutex.lock();
  for (WorkerStream* s : r.streams) s->before_fork();
}

void after_fork_in_parent() {
  ExitRegistry& r = exit_registry();
  for (WorkerStream* s : r.streams) s->after_fork_in_parent();
  r.mutex.unlock();
}

void after_fork_in_child() {
  ExitRegistry& r = exit_registry();
  for (WorkerStream* s : r.streams) s->after_fork_in_child();
  r.mutex.unlock();
}

// The atexit hook: the last resort (see exit_hook.h).
void run_exit_hook() {
  ExitRegistry& r = exit_registry();
  std::lock_guard lock(r.mutex);
  if (r.exited) return;
  r.exited = true;
  for (WorkerStream* s : r.streams) s->abandon();
}

bool on_main_thread() {
  return gettid() == getpid();
}

struct ThreadExitSentinel {
  ~ThreadExitSentinel() {
    ExitRegistry& r = exit_registry();
    // Held throughout so that no stream is destroyed while it is being stopped or drained.
    std::lock_guard lock(r.mutex);
    if (r.exited) return;
    if (on_main_thread()) {
      r.exited = true;
      for (WorkerStream* s : r.streams) s->shutdown();
    } else {
      for (WorkerStream* s : r.streams) s->drain();
    }
  }
};

}  // namespace

void arm_exit_hook() {
  (void)exit_registry();  // created (and fork handlers installed) before the hook can run
  // A failed registration (out of memory) leaves the thread sentinels, which cover every thread that
  // queued work; there is no better recovery than that.
  (void)std::atexit(run_exit_hook);
}

void watch_thread_exit() {
  thread_local ThreadExitSentinel sentinel;
  (void)sentinel;
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
