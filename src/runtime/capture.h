// Capturing op calls instead of running or deferring them: while a CaptureGuard is alive on a thread, every
// op that thread dispatches is appended to the guard's list (after its front end's checks), whatever the
// eager mode. Graph rewrites use it to express a replacement through the ops' own front ends, and compiled
// mode uses it to trace a module's forward.
#pragma once

#include <vector>

#include "kiln/core/pending_work.h"
#include "runtime/op_call.h"

namespace kiln::runtime {

class CaptureGuard : private HostReadObserver {
 public:
  explicit CaptureGuard(std::vector<OpCall>* into);
  ~CaptureGuard();
  CaptureGuard(const CaptureGuard&) = delete;
  CaptureGuard& operator=(const CaptureGuard&) = delete;

 private:
  // While capturing, the values do not exist yet, so a host read (Tensor::data/to_vector/item) breaks the
  // graph; the error names the captured op that makes the tensor, if one does.
  void before_host_read(const Tensor& t) override;

  std::vector<OpCall>* previous_;
  std::vector<OpCall>* into_;
  HostReadObserverScope observing_;
};

// The list the calling thread captures into, or nullptr.
std::vector<OpCall>* capture_target();

}  // namespace kiln::runtime
