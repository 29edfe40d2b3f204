// nn::Conv2d's part of its LoRA adapters (kiln/nn/lora_layer.h; PEFT's lora.Conv2d, kohya's LoCon): the
// pairs it takes and merging up @ down into the kernel.
#include "kiln/nn/layers.h"
#include "kiln/ops/elementwise.h"

namespace kiln::nn {

std::pair<Tensor, Tensor> Conv2d::adapter_pair(const std::string& name, const Tensor& down,
                                               const Tensor& up) const {
  const Shape& d = down.shape();
  const Shape& u = up.shape();
  const bool fits = d.size() == 4 && u.size() == 4 && d[0] > 0 && d[1] == in_ && d[2] == kernel_ &&
                    d[3] == kernel_ && u[0] == out_ && u[1] == d[0] && u[2] == 1 && u[3] == 1;
  KILN_CHECK(fits, "Conv2d.add_adapter '"
                       << name << "': a convolution of weight " << shape_str({out_, in_, kernel_, kernel_})
                       << " takes down [rank, " << in_ << ", " << kernel_ << ", " << kernel_ << "] and up ["
                       << out_ << ", rank, 1, 1], got down " << shape_str(d) << " and up " << shape_str(u));
  return {down, up};
}

void Conv2d::merge_into_weight(const Tensor& delta) {
  original_weight_ = weight;
  weight = add(weight.to(float32), delta.reshape(weight.shape())).to(original_weight_.dtype()).contiguous();
}

void Conv2d::restore_weight() {
  weight = original_weight_.to(weight.device());
  original_weight_ = Tensor();
}

void Conv2d::drop_original_weight() {
  original_weight_ = Tensor();
}

}  // namespace kiln::nn
