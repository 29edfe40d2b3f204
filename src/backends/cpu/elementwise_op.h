// The vocabulary shared by the elementwise kernels (backends/cpu/elementwise.cpp) and their vectorized
// float32-math runs (backends/cpu/isa/elementwise_float.cpp): which op, its scalar parameters, and one
// strided operand of a run.
#pragma once

#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln::cpu_kernels {

enum class EwOp : uint8_t {
  // binary (two operands)
  Add,
  Sub,
  Mul,
  Div,
  Maximum,
  Minimum,
  Pow,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  // ternary: where(cond, a, b)
  Where,
  // unary
  Neg,
  Abs,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Sin,
  Cos,
  Tanh,
  Sigmoid,
  Silu,
  Gelu,
  GeluTanh,
  QuickGelu,
  Square,
  Clamp,
  PowScalar,
};

inline int ew_arity(EwOp op) {
  if (op == EwOp::Where) return 3;
  return op < EwOp::Where ? 2 : 1;
}
inline bool ew_is_comparison(EwOp op) {
  return op >= EwOp::Eq && op <= EwOp::Ge;
}

// Scalar parameters of unary ops: clamp bounds (absent bounds are +-inf) and pow's exponent.
struct EwParams {
  double lo = 0;
  double hi = 0;
  double exponent = 0;
};

// One input of a run: element i lives at data + i * stride (bytes; 0 for a broadcast or scalar operand).
struct EwOperand {
  const char* data;
  int64_t stride;
  DType dtype;
};

}  // namespace kiln::cpu_kernels
