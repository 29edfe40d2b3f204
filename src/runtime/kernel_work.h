// How a kernel reaches a stream, whatever made it (an op call in strict eager, a deferred graph's flush, a
// compiled program's step, a fused elementwise kernel): enqueue_work() puts it on the current execution
// context's stream, after making every tensor it reads safe to read.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/tensor.h"

namespace kiln::runtime {

class KernelWork {
 public:
  virtual ~KernelWork() = default;
  virtual const std::vector<Tensor>& reads() const = 0;
  virtual const std::vector<Tensor>& writes() const = 0;
  // Runs on the stream's thread, with the context that queued it current.
  virtual void run() = 0;
  // "add(float32[2, 3], float32[3]) -> float32[2, 3]": names the work in errors.
  virtual std::string describe() const = 0;
  virtual bool fused() const { return false; }
};

// Queues `work` on the current context's stream of `device`. Before that, on the calling thread: a tensor it
// reads that the context's deferred graph has yet to compute is computed (the graph is flushed), and one that
// another context's stream or graph is writing is waited for; the tensors it writes then name this stream as
// their pending write. When it runs, its reads are reported to the context's memory policy first
// (MemoryPolicy::note_reads: group offload, the resident budget), then it is counted and run.
void enqueue_work(Device device, std::shared_ptr<KernelWork> work);

}  // namespace kiln::runtime
