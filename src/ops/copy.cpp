// Tensor methods that produce new data through the "copy" op.
#include "kiln/core/tensor.h"
#include "runtime/dispatcher.h"

namespace kiln {

void Tensor::copy_(const Tensor& src) {
  KILN_CHECK(defined() && src.defined(), "copy_: undefined tensor");
  runtime::OpCall call{"copy", {src.expand(shape_)}, {*this}, {}};
  runtime::dispatch(std::move(call));
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = Tensor::empty(shape_, dtype_, device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = Tensor::empty(shape_, dtype, device());
  out.copy_(*this);
  return out;
}

// Between devices the copy op runs on the device side's backend (runtime/dispatcher.cpp), which moves the
// bytes.
Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor out = Tensor::empty(shape_, dtype_, device);
  out.copy_(*this);
  return out;
}

}  // namespace kiln
