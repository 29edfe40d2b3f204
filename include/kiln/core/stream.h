// An ordered execution stream: work submitted to one stream runs in submission order.
// Enqueue returns without waiting for the work (the CPU stream runs it on a worker thread, see
// src/runtime/worker_stream.h); a failure is reported by the next synchronize(), naming the op. Ops and
// models never wait themselves: host reads of tensor values and kiln::synchronize() do.
#pragma once

#include <functional>
#include <string>

namespace kiln {

class Stream {
 public:
  virtual ~Stream() = default;
  // `describe` names the op and shapes; it is used in the error if the task fails.
  virtual void enqueue(std::function<void()> task, std::function<std::string()> describe) = 0;
  // Waits until every enqueued task has finished; rethrows the first failure, naming the op, once.
  virtual void synchronize() = 0;
};

}  // namespace kiln
