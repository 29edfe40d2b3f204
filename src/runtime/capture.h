// Capturing op calls instead of running or deferring them: while a CaptureGuard is alive on a thread, every
// op that thread dispatches is appended to the guard's list (after its front end's checks), whatever the
// eager mode. Graph rewrites use it to express a replacement through the ops' own front ends, and compiled
// mode uses it to trace a module's forward.
#pragma once

#include <vector>

#include "runtime/op_call.h"

namespace kiln::runtime {

class CaptureGuard {
 public:
  explicit CaptureGuard(std::vector<OpCall>* into);
  ~CaptureGuard();
  CaptureGuard(const CaptureGuard&) = delete;
  CaptureGuard& operator=(const CaptureGuard&) = delete;

 private:
  std::vector<OpCall>* previous_;
};

// The list the calling thread captures into, or nullptr.
std::vector<OpCall>* capture_target();

// Host reads (Tensor::data/to_vector/item) call this: while capturing, the values do not exist yet, so a
// read breaks the graph; the error names the captured op that makes the tensor, if one does.
void check_host_read(const Tensor& t);

}  // namespace kiln::runtime
