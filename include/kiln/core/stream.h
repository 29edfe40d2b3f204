// An ordered execution stream: work submitted to one stream runs in submission order.
// Enqueue returns without waiting for the work (the CPU stream runs it on a worker thread, see
// src/runtime/worker_stream.h); a failure is reported by the next synchronize(), naming the op. Ops and
// models never wait themselves: host reads of tensor values and kiln::synchronize() do.
//
// A device has as many streams as there are execution contexts using it (kiln/runtime/execution_context.h):
// each context queues its ops on its own, so that one context's failure or synchronisation never involves
// another's work.
#pragma once

#include <functional>
#include <string>

#include "kiln/core/pending_work.h"

namespace kiln {

class Stream : public PendingWork {
 public:
  // `describe` names the op and shapes; it is used in the error if the task fails.
  virtual void enqueue(std::function<void()> task, std::function<std::string()> describe) = 0;
  // Waits until every enqueued task has finished; rethrows the first failure, naming the op, once.
  virtual void synchronize() = 0;
  // Waits for the stream without throwing its failure (which the next synchronize() still reports): for a
  // stream's owner going away, and for other streams that only need its work to be over.
  virtual void drain() = 0;

  void wait() override { synchronize(); }
};

}  // namespace kiln
