// The CPU kernels of the fused ops (kiln/ops/fused.h): linear_fused on oneDNN's matmul with post-ops
// (fused_linear.cpp), norm_modulate on a vectorized row kernel in both ISA variants
// (isa/fused_norm_modulate_rows.cpp, op kernel in fused_norm_modulate.cpp).
#pragma once

#include <cstdint>

#include "backends/cpu/isa_dispatch.h"
#include "kiln/core/dtype.h"
#include "runtime/op_call.h"

namespace kiln::cpu_kernels {

void linear_fused_kernel(const runtime::OpCall& call);
void norm_modulate_kernel(const runtime::OpCall& call);

// For each of `rows` contiguous rows of n elements of x (`dtype`): h = layer norm (layer_norm = true: x
// minus the row mean, times rstd) or RMS norm (x times rstd) in float32, then y = h * (1 + scale) + shift,
// rounded once to `dtype`. scale and shift are float32 [rows / block_rows, n]: row r uses their row
// r / block_rows. Parallel over rows (OpenMP).
KILN_ISA_DECLARE(void, norm_modulate_rows,
                 (bool layer_norm, DType dtype, const void* x, const float* scale, const float* shift,
                  void* y, int64_t rows, int64_t n, int64_t block_rows, float eps))

}  // namespace kiln::cpu_kernels
