// out[M, N] = epilogue(x[M, K] . w[N, K]^T) for bf16 x and w on AMX tiles (TDPBF16PS: 16 x 16 float32
// accumulators += 16 x 32 bf16 by 32 x 16 bf16), where bf16_path() is amx. The weight stays bf16 where it
// lies (mapped from a checkpoint, packed, any strides); x is read in place.
//
// Blocking (as gemm_fma32.h's, with tiles for registers): the output is cut into blocks of up to kRowBlock
// rows x kColBlock columns, one per OpenMP work item. For each slice of kDepthBlock along K, the block's
// weight slice is packed into the layout TDPBF16PS reads (16-column groups, two consecutive K elements side
// by side: a 16 x 16 transpose of 32-bit pairs) unless the whole weight was packed once already
// (Bf16Gemm::w_amx_tiles), then each strip of 32 rows of x (read as tiles straight
// from x, in L1 while it crosses the block) multiplies every 32-column pair of the packed slice (from L2)
// into 2 x 2 accumulator tiles, which live in the block's float32 accumulators between depth slices. The
// epilogue (linear_epilogue.h) rounds the finished block once into the output.
#pragma once

#include <cstdint>

#include "backends/cpu/bf16_gemm.h"

namespace kiln::cpu_kernels {

// Whether gemm_amx takes this product: x's rows contiguous (x_col_stride 1) and K a multiple of 32 (a tile
// step; every width of the supported models is). Other products stay on oneDNN.
bool gemm_amx_takes(const Bf16Gemm& g);

// Runs the whole product on the OpenMP threads. Needs amx_usable() and gemm_amx_takes(g).
void gemm_amx(const Bf16Gemm& g);

// ---- the pieces the driver (gemm_amx.cpp) runs, in the AVX-512 kernel variant only (isa/gemm_amx.cpp)
namespace avx512 {

// Packs weight rows [n0, n0 + cols) x K range [k0, k0 + depth) (depth a multiple of 32) as 16-column groups:
// group j holds depth / 2 rows of 16 pairs, element (k, c) of the group at (k / 2) * 32 + c * 2 + k % 2;
// columns past `cols` are zeros. The panel holds round_up(cols, 16) * depth elements.
void amx_pack_weights(const Bf16Gemm& g, int64_t n0, int64_t cols, int64_t k0, int64_t depth,
                      uint16_t* panel);

// acc[r][c] (+)= sum over k in [k0, k0 + depth) of x[m0 + r][k] * w[n0 + c][k] for r < round_up(rows, 16)
// (rows past `rows` get zeros from x) and the `panel_cols` (a multiple of 16) columns of `panel`, whose
// 16-column groups start `group_stride` elements apart (depth * 16 in a block's slice, K * 16 in a whole
// packed weight); `accumulate` false starts from zero. `edge` holds 32 x (depth + 32) elements, 64-byte
// aligned: a strip's rows copied when fewer than a whole tile remain or when x's rows do not start on cache
// lines. With `finish` (the block's last depth slice), each strip of rows then goes through the epilogue into
// g.out (bf16_gemm.h, BlockColumns).
void amx_block(const Bf16Gemm& g, int64_t m0, int64_t rows, int64_t k0, int64_t depth, const uint16_t* panel,
               int64_t group_stride, int64_t panel_cols, float* acc, int64_t acc_stride, bool accumulate,
               uint16_t* edge, const BlockColumns* finish);

}  // namespace avx512

}  // namespace kiln::cpu_kernels
