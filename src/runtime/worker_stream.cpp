#include "runtime/worker_stream.h"

#include <exception>
#include <utility>

#include "kiln/core/error.h"
#include "runtime/exit_hook.h"

namespace kiln::runtime {

namespace {

// The stream whose worker the calling thread is, if any.
thread_local const WorkerStream* t_worker_of = nullptr;

// Runs `run`; returns the error message naming the task, or an empty string on success.
std::string run_capturing(const std::function<void()>& run, const std::function<std::string()>& describe) {
  try {
    run();
    return {};
  } catch (const Error& e) {
    return describe() + ": " + e.what();
  } catch (const std::exception& e) {
    return describe() + " failed: " + e.what();
  } catch (...) {
    return describe() + " failed with an unknown exception";
  }
}

}  // namespace

WorkerStream::WorkerStream() {
  register_for_exit(this);
}

WorkerStream::~WorkerStream() {
  unregister_for_exit(this);
  shutdown();
  if (park_ && worker_) {
    // Abandoned at exit: the parked worker still sleeps on these signals; leave them (and it) be.
    (void)worker_.release();
    (void)signals_.release();
  }
}

bool WorkerStream::on_worker_thread() const {
  return t_worker_of == this;
}

void WorkerStream::enqueue(std::function<void()> task, std::function<std::string()> describe) {
  const bool on_worker = on_worker_thread();
  // The thread's end (or process exit from it) must first wait for, or stop, what it queued.
  if (!on_worker) watch_thread_exit();
  std::unique_lock lock(mutex_);
  // A shutdown in progress waits for the running task; a task run inline now would overtake it.
  if (stopping_ && !stopped_ && !on_worker) signals_->idle.wait(lock, [&] { return stopped_; });
  if (stopped_ || on_worker) {
    lock.unlock();
    const std::string failure = run_capturing(task, describe);
    if (!failure.empty()) throw Error(failure);
    return;
  }
  if (!worker_) {
    worker_ = std::make_unique<std::thread>([this] { worker_main(); });
    arm_exit_hook();
  }
  queue_.push_back(Task{std::move(task), std::move(describe)});
  ++enqueued_;
  const bool wake = worker_waiting_;
  lock.unlock();
  if (wake) signals_->has_work.notify_one();
}

void WorkerStream::synchronize() {
  if (on_worker_thread()) return;
  std::unique_lock lock(mutex_);
  ++waiters_;
  signals_->idle.wait(lock, [&] { return finished_ == enqueued_ || stopped_; });
  --waiters_;
  if (!failed_) return;
  failed_ = false;
  std::string failure = std::move(failure_);
  failure_.clear();
  throw Error(failure);
}

void WorkerStream::drain() {
  if (on_worker_thread()) return;
  std::unique_lock lock(mutex_);
  const uint64_t target = enqueued_;
  ++waiters_;
  signals_->idle.wait(lock, [&] { return finished_ >= target || stopped_; });
  --waiters_;
}

std::deque<WorkerStream::Task> WorkerStream::stop_locked(std::unique_lock<std::mutex>& lock,
                                                         bool park_worker) {
  stopping_ = true;
  park_ = park_worker;
  if (!on_worker_thread()) {
    ++waiters_;
    signals_->idle.wait(lock, [&] { return !running_; });
    --waiters_;
  }
  std::deque<Task> dropped = std::move(queue_);
  queue_.clear();
  finished_ += dropped.size();
  if (!dropped.empty() && !failed_) {
    // A thread still waiting for these results must not take the outputs for computed.
    failed_ = true;
    failure_ = "cpu stream: stopped (process exit or stream destroyed) before " +
               std::to_string(dropped.size()) + " queued ops ran, the first being " +
               dropped.front().describe();
  }
  stopped_ = true;
  signals_->idle.notify_all();
  return dropped;
}

void WorkerStream::shutdown() {
  const bool on_worker = on_worker_thread();
  std::unique_lock lock(mutex_);
  if (stopping_) {
    // Someone else is stopping the stream; return once it is stopped (never wait on ourselves).
    if (!on_worker) signals_->idle.wait(lock, [&] { return stopped_; });
    return;
  }
  std::deque<Task> dropped = stop_locked(lock, /*park_worker=*/false);
  std::unique_ptr<std::thread> worker = std::move(worker_);
  lock.unlock();
  signals_->has_work.notify_all();
  if (worker) {
    if (on_worker)
      worker->detach();  // exit() from inside a task: the worker cannot join itself
    else
      worker->join();
  }
  // Dropped tasks release their tensors here, on the caller, while everything they use is alive.
  dropped.clear();
}

void WorkerStream::abandon() {
  const bool on_worker = on_worker_thread();
  std::unique_lock lock(mutex_);
  if (stopping_) {
    if (!on_worker) signals_->idle.wait(lock, [&] { return stopped_; });
    return;
  }
  // The worker is not woken: it stays asleep (or parks after its task) and so never runs its thread's
  // destructors or touches a destroyed static. The dropped tasks are kept, not destroyed, for the same
  // reason; the stream itself is never destroyed on this path (the CPU runtime is immortal).
  std::deque<Task> dropped = stop_locked(lock, /*park_worker=*/true);
  for (Task& t : dropped) abandoned_.push_back(std::move(t));
}

void WorkerStream::worker_main() {
  t_worker_of = this;
  std::unique_lock lock(mutex_);
  for (;;) {
    worker_waiting_ = true;
    signals_->has_work.wait(lock, [&] { return !queue_.empty() || stopping_; });
    worker_waiting_ = false;
    if (stopping_) break;
    Task task = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = failed_;
    running_ = true;
    lock.unlock();
    std::string failure = skip ? std::string() : run_capturing(task.run, task.describe);
    // Release the op's tensors before reporting completion, so memory is back once synchronize returns.
    task = Task{};
    lock.lock();
    running_ = false;
    ++finished_;
    if (!failure.empty() && !failed_) {
      failed_ = true;
      failure_ = std::move(failure);
    }
    if (waiters_ > 0) signals_->idle.notify_all();
  }
  // Parked for good (abandon()): the process is exiting and ends this thread.
  if (park_) signals_->has_work.wait(lock, [] { return false; });
}

void WorkerStream::before_fork() {
  std::unique_lock lock(mutex_);
  if (!on_worker_thread()) {
    ++waiters_;
    signals_->idle.wait(lock, [&] { return finished_ == enqueued_ || stopped_; });
    --waiters_;
  }
  lock.release();  // held through fork(); released by after_fork_in_parent/child
}

void WorkerStream::after_fork_in_parent() {
  mutex_.unlock();
}

void WorkerStream::after_fork_in_child() {
  // Only the forking thread exists in the child: the worker (and its OpenMP team) did not come along. Its
  // handle is forgotten, never joined (a join would wait for a thread that is not there), and the signals
  // are fresh, since the copied ones may count the parent's sleeping worker as a waiter.
  (void)worker_.release();
  (void)signals_.release();
  signals_ = std::make_unique<Signals>();
  worker_waiting_ = false;
  waiters_ = 0;
  if (running_ || !queue_.empty()) {
    // fork() from inside a task: what was running and queued never finishes in this process.
    for (Task& t : queue_) abandoned_.push_back(std::move(t));
    queue_.clear();
    running_ = false;
    finished_ = enqueued_;
    if (!failed_) {
      failed_ = true;
      failure_ =
          "cpu stream: the process forked while ops were running or queued; their results do not "
          "exist in the child process";
    }
  }
  mutex_.unlock();
}

}  // namespace kiln::runtime
