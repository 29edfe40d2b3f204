#include "runtime/capture.h"

#include <iterator>
#include <string>

namespace kiln::runtime {

namespace {
thread_local std::vector<OpCall>* t_capture = nullptr;
}  // namespace

CaptureGuard::CaptureGuard(std::vector<OpCall>* into) : previous_(t_capture), into_(into), observing_(this) {
  t_capture = into;
}

CaptureGuard::~CaptureGuard() {
  t_capture = previous_;
}

std::vector<OpCall>* capture_target() {
  return t_capture;
}

void CaptureGuard::before_host_read(const Tensor& t) {
  std::string made_by = "a tensor the traced code did not compute";
  for (auto it = into_->rbegin(); it != into_->rend(); ++it)
    for (const Tensor& o : it->outputs)
      if (o.defined() && o.storage() == t.storage()) {
        made_by = "the result of " + it->describe();
        it = std::prev(into_->rend());
        break;
      }
  KILN_FAIL(
      "the traced forward reads tensor values on the host ("
      << made_by
      << "), which breaks the graph: ops are being recorded, not run; compute it with ops, or move the read "
         "out of the compiled forward");
}

}  // namespace kiln::runtime
