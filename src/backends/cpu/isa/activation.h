// The activations that both the elementwise ops (elementwise_float.cpp) and the linear epilogue
// (linear_epilogue.cpp) apply, written once so that a fused linear + activation rounds exactly like the
// unfused pair. Only for the per-ISA files in this folder (needs vec.h).
#pragma once

#include "backends/cpu/isa/vec.h"

namespace kiln::cpu_kernels::KILN_ISA {

// x * g(x) activations tend to 0 as x -> -inf, but the formula gives -inf * 0 = NaN there (torch returns
// NaN).
inline f32x16 limit_at_minus_inf(f32x16 x, f32x16 r) {
  return x == -__builtin_inff() ? splat(-0.0f) : r;
}

inline f32x16 act_silu(f32x16 x) {
  return limit_at_minus_inf(x, x / (1.0f + vexp(-x)));
}

inline f32x16 act_gelu(f32x16 x) {
  return limit_at_minus_inf(x, x * 0.5f * (1.0f + verf(x * 0.70710678118654752f)));
}

inline f32x16 act_gelu_tanh(f32x16 x) {
  // sqrt(2/pi) * (x + 0.044715 x^3), evaluated in torch's order.
  const f32x16 inner = 0.797884560802865355f * (x + 0.044715f * (x * x * x));
  return limit_at_minus_inf(x, 0.5f * x * (1.0f + vtanh(inner)));
}

}  // namespace kiln::cpu_kernels::KILN_ISA
