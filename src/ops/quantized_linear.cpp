// Front end of the "linear_quantized" op (kiln/ops/quantized_linear.h).
#include "kiln/ops/quantized_linear.h"

#include "runtime/dispatcher.h"

namespace kiln {

Tensor linear(const Tensor& x, const quant::QuantizedTensor& weight, const Tensor& bias) {
  const char* op = "linear (quantized weight)";
  KILN_CHECK(x.defined() && weight.defined(), op << ": x and weight must be defined");
  KILN_CHECK(quant::traits(weight.type).is_quantized,
             op << ": weight type " << quant::type_name(weight.type) << " is not a quantized storage type");
  KILN_CHECK(weight.shape.size() == 2,
             op << ": expected weight [out_features, in_features], got " << shape_str(weight.shape));
  const int64_t n = weight.shape[0], k = weight.shape[1];
  KILN_CHECK(weight.blocks.dtype() == uint8 && weight.blocks.dim() == 2 && weight.blocks.size(0) == n &&
                 weight.blocks.size(1) == quant::row_bytes(weight.type, k) && weight.blocks.stride(1) == 1,
             op << ": the " << quant::type_name(weight.type) << " blocks of weight "
                << shape_str(weight.shape) << " must be uint8 [" << n << ", "
                << quant::row_bytes(weight.type, k) << "] with contiguous rows, got " << weight.blocks.str());
  KILN_CHECK(x.dim() >= 1 && x.size(-1) == k,
             op << ": x " << shape_str(x.shape()) << " does not end in the weight's " << k << " in_features");
  KILN_CHECK(x.dtype() == float32 || x.dtype() == bfloat16,
             op << ": x must be float32 or bfloat16, got " << dtype_name(x.dtype()));
  Tensor b;
  if (bias.defined()) {
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == n,
               op << ": expected bias [" << n << "], got " << shape_str(bias.shape()));
    KILN_CHECK(bias.dtype() == x.dtype() || bias.dtype() == float32,
               op << ": bias is " << dtype_name(bias.dtype()) << " but x is " << dtype_name(x.dtype())
                  << "; expected the same dtype or float32");
    b = bias.contiguous();
  }
  Shape out_shape = x.shape();
  out_shape.back() = n;
  const int64_t m = x.numel() / std::max<int64_t>(k, 1);
  if (m == 0 || n == 0) return Tensor::empty(out_shape, x.dtype(), x.device());
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  std::vector<Tensor> inputs{x.reshape({m, k}).contiguous(), weight.blocks};
  if (b.defined()) inputs.push_back(b);
  runtime::dispatch(runtime::OpCall{"linear_quantized",
                                    std::move(inputs),
                                    {out.view({m, n})},
                                    runtime::Attrs().set("type", static_cast<int64_t>(weight.type))});
  return out;
}

}  // namespace kiln
