// WorkerStream: a Stream whose tasks run in submission order on one dedicated host thread, so that
// enqueue returns at once and the caller keeps preparing the next ops while kernels run (kernels still
// parallelise inside with OpenMP, from the worker). The CPU device uses it; any backend whose work is
// driven from the host can.
//
// Failures: the first task to throw is recorded with its description ("add(float32[2]) -> ...: message");
// every task queued after it is skipped (its inputs may be garbage), and the next synchronize() throws that
// one error as a kiln::Error and clears it, so it is reported once and the stream is usable again.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "kiln/core/stream.h"

namespace kiln::runtime {

class WorkerStream final : public Stream {
 public:
  WorkerStream();            // registers with the exit hook (runtime/exit_hook.h)
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

 private:
  struct Task {
    std::function<void()> run;
    std::function<std::string()> describe;
  };
  void worker_main();

  std::mutex mutex_;
  std::condition_variable has_work_;  // worker waits: queue not empty or stopping
  std::condition_variable idle_;      // synchronize/shutdown wait: nothing running (and queue empty)
  std::deque<Task> queue_;
  bool running_ = false;         // the worker is inside a task
  bool worker_waiting_ = false;  // the worker sleeps on has_work_ (so enqueue knows to wake it)
  bool stopping_ = false;
  bool stopped_ = false;
  bool failed_ = false;  // a task failed and synchronize has not reported it yet
  std::string failure_;
  std::thread worker_;
};

}  // namespace kiln::runtime
