// WorkerStream: a Stream whose tasks run in submission order on one dedicated host thread, so that
// enqueue returns at once and the caller keeps preparing the next ops while kernels run (kernels still
// parallelise inside with OpenMP, from the worker). The CPU device uses it; any backend whose work is
// driven from the host can.
//
// Failures: the first task to throw is recorded with its description ("add(float32[2]) -> ...: message");
// every task queued after it is skipped (its inputs may be garbage), and the next synchronize() throws that
// one error as a kiln::Error and clears it, so it is reported once and the stream is usable again.
//
// Process exit and fork: see runtime/exit_hook.h. In short, the worker is stopped before any static
// destructor runs, and fork() waits for queued work so that the child starts from an idle stream.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "kiln/core/stream.h"

namespace kiln::runtime {

class WorkerStream final : public Stream {
 public:
  WorkerStream();            // registers with the exit and fork handling (runtime/exit_hook.h)
  ~WorkerStream() override;  // shutdown(), unregisters
  WorkerStream(const WorkerStream&) = delete;
  WorkerStream& operator=(const WorkerStream&) = delete;

  // Queues `task`; the worker thread starts on the first call. Called from this stream's own worker (a
  // kernel dispatching an op) or after shutdown(), the task runs at once on the caller instead, and a
  // failure is thrown there.
  void enqueue(std::function<void()> task, std::function<std::string()> describe) override;
  // Waits until every queued task has finished or been skipped, then throws the recorded failure, if any.
  // On the worker itself it returns at once: everything queued before the running task has finished.
  void synchronize() override;

  // Waits for the task in flight, drops the queued ones without running them, and joins the worker; later
  // tasks run inline on their caller. For process exit and destruction; idempotent.
  void shutdown();

  // True on the calling thread while it is this stream's worker.
  bool on_worker_thread() const;

  // ---- for runtime/exit_hook.cpp
  // Waits (without throwing) until every task queued before the call has finished or been skipped.
  void drain();
  // The last-resort exit path, when static destructors may already have run: waits for the task in flight,
  // then leaves the worker parked for good and leaks the dropped tasks, so that nothing touches what may
  // already be destroyed (the worker thread ends with the process). Later tasks run inline.
  void abandon();
  // fork(): before, waits for the queue to empty (unless called on the worker) and holds the lock through
  // the fork; after, releases it in the parent, and in the child forgets the worker thread, which does not
  // exist there.
  void before_fork();
  void after_fork_in_parent();
  void after_fork_in_child();

 private:
  struct Task {
    std::function<void()> run;
    std::function<std::string()> describe;
  };
  // Condition variables are re-created in a forked child (a copied one may count waiters that do not exist
  // there), so they live behind a pointer.
  struct Signals {
    std::condition_variable has_work;  // worker waits: queue not empty or stopping
    std::condition_variable idle;      // synchronize/shutdown/drain wait for progress
  };
  void worker_main();
  // Waits until nothing runs; then marks the stream stopped and returns the queued tasks. Lock held.
  std::deque<Task> stop_locked(std::unique_lock<std::mutex>& lock, bool park_worker);

  std::mutex mutex_;
  std::unique_ptr<Signals> signals_ = std::make_unique<Signals>();
  std::deque<Task> queue_;
  uint64_t enqueued_ = 0;        // tasks ever queued
  uint64_t finished_ = 0;        // tasks ever finished, skipped or dropped
  bool running_ = false;         // the worker is inside a task
  bool worker_waiting_ = false;  // the worker sleeps on has_work (so enqueue knows to wake it)
  bool stopping_ = false;        // shutdown has begun: no task is taken any more
  bool stopped_ = false;         // the worker is gone or parked: tasks run inline
  bool park_ = false;            // the worker must never return (abandon())
  int waiters_ = 0;              // threads waiting on idle (the worker signals them after each task)
  bool failed_ = false;          // a task failed and synchronize has not reported it yet
  std::string failure_;
  std::deque<Task> abandoned_;  // dropped by abandon() or a fork, kept (never destroyed) on purpose
  std::unique_ptr<std::thread> worker_;
};

}  // namespace kiln::runtime
