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

}  // namespace kiln::cpu_kernels
