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
}

bool WorkerStream::on_worker_thread() const {
  return t_worker_of == this;
}

void WorkerStream::enqueue(std::function<void()> task, std::function<std::string()> describe) {
  std::unique_lock lock(mutex_);
  if (stopped_ || on_worker_thread()) {
    lock.unlock();
    const std::string failure = run_capturing(task, describe);
    if (!failure.empty()) throw Error(failure);
    return;
  }
  if (!worker_.joinable()) {
    worker_ = std::thread([this] { worker_main(); });
    // Queued work must be finished or dropped before process exit tears down what kernels use.
    arm_exit_hook();
  }
  queue_.push_back(Task{std::move(task), std::move(describe)});
  const bool wake = worker_waiting_;
  lock.unlock();
  if (wake) has_work_.notify_one();
}

void WorkerStream::synchronize() {
  if (on_worker_thread()) return;
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return (queue_.empty() || stopping_) && !running_; });
  if (!failed_) return;
  failed_ = false;
  std::string failure = std::move(failure_);
  failure_.clear();
  throw Error(failure);
}

void WorkerStream::shutdown() {
  std::unique_lock lock(mutex_);
  if (stopped_ || stopping_) return;
  stopping_ = true;
  if (on_worker_thread()) return;  // exit() called from inside a task: the worker cannot join itself
  idle_.wait(lock, [&] { return !running_; });
  std::deque<Task> dropped = std::move(queue_);
  queue_.clear();
  stopped_ = true;
  lock.unlock();
  has_work_.notify_all();
  if (worker_.joinable()) worker_.join();
  // Dropped tasks release their tensors here, on the caller.
  dropped.clear();
}

void WorkerStream::worker_main() {
  t_worker_of = this;
  std::unique_lock lock(mutex_);
  for (;;) {
    worker_waiting_ = true;
    has_work_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    worker_waiting_ = false;
    if (stopping_) return;
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
    if (!failure.empty() && !failed_) {
      failed_ = true;
      failure_ = std::move(failure);
    }
    if (queue_.empty() || stopping_) idle_.notify_all();
  }
}

}  // namespace kiln::runtime
