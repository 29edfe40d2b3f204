// Small pieces of math the lowerings share: the float32 compute rule of the CPU kernels and the activations
// (defined once, as isa/elementwise_math.h does for the CPU, so a fused linear's epilogue rounds like the
// unfused op).
#pragma once

#include "backends/pjrt/stablehlo/hlo_builder.h"
#include "kiln/ops/fused.h"

namespace kiln::pjrt::hlo {

// float32, bfloat16 and float16 compute in float32 on the CPU kernels.
inline bool is_float_math(DType d) {
  return d == DType::Float32 || d == DType::BFloat16 || d == DType::Float16;
}
inline Value to_f32(HloBuilder& b, const Value& x) {
  return b.convert(x, DType::Float32);
}
// A float32 scalar broadcast to x's shape.
inline Value splat_like(HloBuilder& b, double v, const Value& x) {
  return b.splat(v, x.dtype, x.shape);
}

// x * g(x) activations are -0 at x = -inf (the formula gives NaN there), as the CPU kernels define them.
Value silu(HloBuilder& b, const Value& x);
Value gelu(HloBuilder& b, const Value& x);
Value gelu_tanh(HloBuilder& b, const Value& x);
Value quick_gelu(HloBuilder& b, const Value& x);
// 1 / (1 + exp(-x)), the CPU kernels' sigmoid (not logistic, whose rounding differs by an ulp on some
// plugins).
Value sigmoid(HloBuilder& b, const Value& x);
// `act` of a float32 value: the elementwise op it stands for (ops/activation_op.h).
Value activation(HloBuilder& b, Activation act, const Value& x);

// Sum over `dims` of float32 x divided by their element count.
Value mean_over(HloBuilder& b, const Value& x, const std::vector<int64_t>& dims);
// x with a reduced value `r` (x's shape without `dims`) broadcast back to x's shape.
Value expand_reduced(HloBuilder& b, const Value& r, const Value& x, const std::vector<int64_t>& dims);

}  // namespace kiln::pjrt::hlo
