// An ordered execution stream: work submitted to one stream runs in submission order.
// The CPU stream executes each task as it is enqueued; the asynchronous dispatch of the execution-modes
// work plugs in behind this same interface, so ops and models never change.
#pragma once

#include <functional>
#include <string>

namespace kiln {

class Stream {
 public:
  virtual ~Stream() = default;
  // `describe` names the op and shapes; it is used in the error if the task fails.
  virtual void enqueue(std::function<void()> task, std::function<std::string()> describe) = 0;
  // Waits until every enqueued task has finished; rethrows the first failure, naming the op.
  virtual void synchronize() = 0;
};

}  // namespace kiln
