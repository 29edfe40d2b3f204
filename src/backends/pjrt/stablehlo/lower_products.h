// Pieces of the product lowerings shared by lower_linalg.cpp and lower_fused.cpp.
#pragma once

#include "backends/pjrt/stablehlo/hlo_builder.h"

namespace kiln::pjrt::hlo {

// float32 for float32 / bfloat16 / float16 operands (what the CPU kernels accumulate in), float64 for
// float64.
DType accumulator_dtype(DType operands);
// x [m, k] times weight [n, k] transposed -> [m, n] in the accumulator dtype.
Value linear_product(HloBuilder& b, const Value& x, const Value& w);
// acc + bias (converted to acc's dtype) along dim `dim` of acc.
Value add_bias_f32(HloBuilder& b, const Value& acc, const Value& bias, int64_t dim);

}  // namespace kiln::pjrt::hlo
