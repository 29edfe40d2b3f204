// The glue between the "linear" / "linear_fused" kernels and the f32-FMA GEMM.
#pragma once

#include "kiln/core/tensor.h"
#include "kiln/ops/fused.h"

namespace kiln::cpu_kernels {

// Whether this product runs on the f32-FMA GEMM: bf16 x and weight, bf16_path() is fma32, and x has at least
// kFma32MinRows rows or the path was forced (matmul_path.h).
bool fma32_serves(const Tensor& x, const Tensor& w);

// out [M, N] (columns adjacent) = epilogue(x [M, K] . w [N, K]^T) with optional bias [N], gate [G, 1 or N]
// (see linear_epilogue.h) and residual [M, N]; x and w row- or column-major.
// `add_output`: `out` already holds a term (a LoRA pair's low-rank product) that the result adds after the
// bias.
void linear_fma32(const Tensor& x, const Tensor& w, const Tensor* bias, Activation act, const Tensor* gate,
                  const Tensor* residual, bool add_output, const Tensor& out);

}  // namespace kiln::cpu_kernels
