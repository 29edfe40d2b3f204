// The vectorized kernels behind reductions, softmax, the norms and rotary embedding. Each exists in both ISA
// variants (src/backends/cpu/isa/{reduction,norm,rope}_kernels.cpp); the op kernels in reduction.cpp and
// layout.cpp pick one with KILN_ISA_CALL. Every function takes contiguous float data (float32, bfloat16 or
// float16 as `dtype`), computes in float32 and parallelises over rows with OpenMP itself.
#pragma once

#include <cstdint>

#include "backends/cpu/isa_dispatch.h"
#include "kiln/core/dtype.h"
#include "kiln/ops/layout.h"

namespace kiln::cpu_kernels {

enum class ReduceKind : int { Sum, Mean, Max, Var };

// x is [outer, r, inner] and out [outer, inner], both of `dtype`; reduces over r. `correction` is for Var.
KILN_ISA_DECLARE(void, reduce_float,
                 (ReduceKind kind, DType dtype, const void* x, void* out, int64_t outer, int64_t r,
                  int64_t inner, int64_t correction))

// Softmax of each of `rows` rows of n elements; x and y of `dtype`.
KILN_ISA_DECLARE(void, softmax_rows, (DType dtype, const void* x, void* y, int64_t rows, int64_t n))

// Layer norm of each row: y = (x - mean) * rstd * w + b. w and b (float32, n values) may be null.
KILN_ISA_DECLARE(void, layer_norm_rows,
                 (DType dtype, const void* x, const float* w, const float* b, void* y, int64_t rows,
                  int64_t n, float eps))

// RMS norm of each row: h = x * rsqrt(mean(x^2) + eps) rounded to `h_dtype`; y = h * w (w float32, may be
// null) written as `y_dtype`.
KILN_ISA_DECLARE(void, rms_norm_rows,
                 (DType x_dtype, const void* x, const float* w, DType h_dtype, DType y_dtype, void* y,
                  int64_t rows, int64_t n, float eps))

// Group norm of x [batch, channels, spatial] with `groups` groups; w and b (float32, per channel) may be
// null.
KILN_ISA_DECLARE(void, group_norm,
                 (DType dtype, const void* x, const float* w, const float* b, void* y, int64_t batch,
                  int64_t channels, int64_t spatial, int64_t groups, float eps))

// Rotary embedding. x is [B, H, S, D] with element strides x_strides = {B, H, S} (the last dim contiguous);
// cos and sin are contiguous float32 [S, D]; y is contiguous [B, H, S, D]. x and y of `dtype`.
struct RopeShape {
  int64_t batch, heads, seq, dim;
  int64_t x_strides[3];  // elements, of the batch, head and sequence dims; the last dim is contiguous
  int64_t y_strides[3];  // the same for the output
};
KILN_ISA_DECLARE(void, rope,
                 (RopeStyle style, DType dtype, const void* x, const RopeShape& shape, const float* cos,
                  const float* sin, void* y))

}  // namespace kiln::cpu_kernels
