// The float32 math of every elementwise op that is more than one operator or one vec.h call, written once.
// Three users must round alike, bit for bit: the unfused elementwise kernels (elementwise_float.cpp), the
// linear epilogue (linear_epilogue.cpp, so a fused linear + activation matches the unfused pair), and the
// CPU JIT's fused kernels, whose generated source embeds this file verbatim (src/graph/jit_preamble.cmake;
// graph/cpu_codegen.cpp calls these functions by name). Only for the per-ISA files in this folder and the
// JIT's preamble: it needs vec.h, and its only include is that one (the JIT pastes the two files in order
// and drops the line).
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

inline f32x16 act_quick_gelu(f32x16 x) {
  return limit_at_minus_inf(x, x * vsigmoid(1.702f * x));
}

// A division rather than an approximate reciprocal square root: torch's rsqrt rounds like 1 / sqrt.
inline f32x16 ew_rsqrt(f32x16 x) {
  return 1.0f / vsqrt(x);
}

// torch propagates a NaN from either side (vmax/vmin do not).
inline f32x16 ew_maximum(f32x16 x, f32x16 z) {
  const f32x16 r = x > z ? x : z;
  return x != x ? x : (z != z ? z : r);
}
inline f32x16 ew_minimum(f32x16 x, f32x16 z) {
  const f32x16 r = x < z ? x : z;
  return x != x ? x : (z != z ? z : r);
}

// clamp's two bounds, applied lo first; written so that a NaN input stays NaN, like torch.clamp.
inline f32x16 ew_clamp_lo(f32x16 x, f32x16 lo) {
  return x < lo ? lo : x;
}
inline f32x16 ew_clamp_hi(f32x16 x, f32x16 hi) {
  return x > hi ? hi : x;
}

}  // namespace kiln::cpu_kernels::KILN_ISA
