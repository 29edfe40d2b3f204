// out[M, N] = epilogue(x[M, K] . w[N, K]^T) for bf16 x and w, multiplied with float32 FMAs: the products of
// bf16 numbers are exact in float32, so this is as precise as vdpbf16ps, and faster on CPUs whose FMA
// outruns it (matmul_path.h). The weight stays bf16 where it lies (mapped from a checkpoint, any row or
// column stride): each cache block of it is widened into a thread-local float32 panel when it is used.
//
// Blocking (BLIS's scheme, with the weight in the role of BLIS's B): the output is cut into blocks of up to
// kRowBlock rows x kColBlock columns, one block per OpenMP work item. For each slice of kDepthBlock along K,
// the block's weight slice is widened and packed into panels of tile.nr columns (kDepthBlock x kColBlock
// floats, L2-resident), then each strip of tile.mr rows of x is widened (L1-resident) and swept across the
// panels by the register-tile micro-kernel, accumulating into the block's float32 accumulators. The epilogue
// (linear_epilogue.h) rounds the finished block once into the output.
#pragma once

#include <cstdint>

#include "backends/cpu/bf16_gemm.h"
#include "backends/cpu/isa_dispatch.h"

namespace kiln::cpu_kernels {

// Runs the whole product on the OpenMP threads, in the AVX-512 or the portable kernel variant.
void gemm_fma32(const Bf16Gemm& g, bool avx512);

// ---- the per-ISA pieces the driver (gemm_fma32.cpp) runs; isa/gemm_fma32.cpp

// The micro-kernel's register tile: mr rows of x by nr columns of w.
struct Fma32Tile {
  int64_t mr = 0, nr = 0;
};
KILN_ISA_DECLARE(Fma32Tile, fma32_tile, ());

// Packs weight rows [n0, n0 + cols) x K range [k0, k0 + depth) as float32 panels of tile.nr weight rows:
// panel p holds depth groups of nr floats (weight row n0 + p * nr + j at position j), zeros past `cols`.
KILN_ISA_DECLARE(void, fma32_pack_weights,
                 (const Bf16Gemm& g, int64_t n0, int64_t cols, int64_t k0, int64_t depth, float* panels));

// acc[r][c] (+)= sum over k in [k0, k0 + depth) of x[m0 + r][k] * w[n0 + c][k] for rows < `rows` and the
// `panel_cols` (a multiple of tile.nr) columns packed in `panels`; `accumulate` false starts from zero.
// `strip` holds tile.mr x depth floats (x widened). With `finish` (the block's last depth slice), each strip
// of rows then goes through the epilogue into g.out (bf16_gemm.h, BlockColumns).
KILN_ISA_DECLARE(void, fma32_block,
                 (const Bf16Gemm& g, int64_t m0, int64_t rows, int64_t k0, int64_t depth, const float* panels,
                  int64_t panel_cols, float* acc, int64_t acc_stride, bool accumulate, float* strip,
                  const BlockColumns* finish));

}  // namespace kiln::cpu_kernels
