// What a linear does to its float32 accumulators before the one rounding to the output: bias, the term
// already in the output (a LoRA pair's low-rank product), activation, gate, residual, in that order (oneDNN's
// post-op order and the reference's, src/ops/fused.cpp). Shared by the f32-FMA GEMM for "linear" and
// "linear_fused" (gemm_fma32.h); the activations themselves are the elementwise ops'
// (isa/elementwise_math.h).
#pragma once

#include <cstdint>

#include "backends/cpu/isa_dispatch.h"
#include "kiln/core/dtype.h"
#include "kiln/ops/fused.h"

namespace kiln::cpu_kernels {

struct LinearEpilogueArgs {
  const void* bias = nullptr;  // [N], contiguous
  DType bias_dtype = float32;
  bool add_output = false;  // the output holds a term to add before the activation (oneDNN's sum post-op)
  Activation act = Activation::None;
  // [G, 1 or N]: G = 1 serves every row; otherwise output row i uses gate row i / (M / G).
  const void* gate = nullptr;
  DType gate_dtype = float32;
  int64_t gate_rows = 0, gate_cols = 0, gate_row_stride = 0;
  const void* residual = nullptr;  // [M, N], columns adjacent
  DType residual_dtype = float32;
  int64_t residual_row_stride = 0;
  int64_t m = 0;  // all output rows (for the gate's row blocks)
};

// Output rows [m0, m0 + rows), columns [n0, n0 + cols) from float32 accumulators `acc` (row r, column c at
// acc[r * acc_stride + c], relative to m0 and n0; overwritten: the steps run on it in place), written in
// `out_dtype` (float32, bfloat16 or float16) at `out` (the element of row 0, column 0 of the whole output)
// with rows `out_row_stride` elements apart.
KILN_ISA_DECLARE(void, linear_epilogue_rows,
                 (float* acc, int64_t acc_stride, int64_t m0, int64_t rows, int64_t n0, int64_t cols,
                  const LinearEpilogueArgs& e, void* out, DType out_dtype, int64_t out_row_stride));

}  // namespace kiln::cpu_kernels
