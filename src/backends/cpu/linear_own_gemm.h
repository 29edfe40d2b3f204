// The glue between the "linear" / "linear_fused" kernels and Kiln's own bf16 GEMMs: the f32-FMA one
// (gemm_fma32.h) and the AMX one (gemm_amx.h), for the products bf16_path() gives them (matmul_path.h).
#pragma once

#include "kiln/core/tensor.h"
#include "kiln/ops/fused.h"

namespace kiln::cpu_kernels {

enum class OwnGemm { None, Fma32, Amx };

// Which of Kiln's GEMMs runs this product, or None for oneDNN: bf16 x and weight, and
//  - Fma32 where bf16_path() is fma32 and x has at least kFma32MinRows rows (or the path was forced);
//  - Amx where bf16_path() is amx, x has at least kAmxMinRows rows (or the path was forced), and
//    gemm_amx_takes the product (x's rows contiguous, K a multiple of 32).
OwnGemm own_gemm_for(const Tensor& x, const Tensor& w);

// out [M, N] (columns adjacent) = epilogue(x [M, K] . w [N, K]^T) with optional bias [N], gate [G, 1 or N]
// (see linear_epilogue.h) and residual [M, N]; x and w row- or column-major, on `gemm` (not None).
// `add_output`: `out` already holds a term (a LoRA pair's low-rank product) that the result adds after the
// bias. `prepack` (the op's attribute): the AMX GEMM reads a copy of the weight packed once into its tile
// layout (amx_packed_weights.h) where the packed-weight budget allows; the f32-FMA GEMM always reads the
// weight where it lies.
void linear_own_gemm(OwnGemm gemm, const Tensor& x, const Tensor& w, const Tensor* bias, Activation act,
                     const Tensor* gate, const Tensor* residual, bool add_output, bool prepack,
                     const Tensor& out);

}  // namespace kiln::cpu_kernels
