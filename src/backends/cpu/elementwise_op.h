// The vocabulary shared by the elementwise kernels (backends/cpu/elementwise.cpp) and their vectorized
// float32-math runs (backends/cpu/isa/elementwise_float.cpp): which op (runtime/elementwise_op.h), its scalar
// parameters, and one strided operand of a run.
#pragma once

#include <cstdint>

#include "kiln/core/dtype.h"
#include "runtime/elementwise_op.h"

namespace kiln::cpu_kernels {

// The op itself is the runtime's (one enum for the kernels, the fused regions and the op table).
using runtime::ew_arity;
using runtime::ew_is_comparison;
using runtime::EwOp;

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
