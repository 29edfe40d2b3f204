// The operands of a bf16 product on Kiln's own GEMMs: out[M, N] = epilogue(x[M, K] . w[N, K]^T), multiplied
// with float32 FMAs on widened operands (gemm_fma32.h) or on AMX tiles (gemm_amx.h), whichever is this host's
// faster path (matmul_path.h).
#pragma once

#include <cstdint>

#include "backends/cpu/linear_epilogue.h"

namespace kiln::cpu_kernels {

struct Bf16Gemm {
  const void* x = nullptr;  // bf16 [M, K]
  int64_t x_row_stride = 0, x_col_stride = 0;
  const void* w = nullptr;  // bf16 [N, K]
  int64_t w_row_stride = 0, w_col_stride = 0;
  // The AMX GEMM only: the whole weight already in its tile layout (amx_packed_weights.h), or null to pack
  // each block's slice per call.
  const uint16_t* w_amx_tiles = nullptr;
  int64_t m = 0, n = 0, k = 0;
  void* out = nullptr;  // [M, N], columns adjacent
  DType out_dtype = bfloat16;
  int64_t out_row_stride = 0;
  LinearEpilogueArgs epilogue;
};

// The output columns [n0, n0 + cols) of a block whose last depth slice a block kernel (amx_block,
// fma32_block) is computing: it then finishes each strip of rows (the epilogue, the rounding to `out`) as
// soon as the strip's accumulators are final, while they are still in L1 or L2, rather than reading the
// whole block's (2-3 MiB) back from L3 afterwards. Compiled SD3.5-shaped steps ran 0.5-1.5% faster that way;
// the epilogue's own time is mostly its activation and the stores of the output rows.
struct BlockColumns {
  int64_t n0 = 0, cols = 0;
};

}  // namespace kiln::cpu_kernels
