// AMX tile products for the AVX-512 variant of the kernels in this folder: C (float32) = or += A (bfloat16,
// row-major) x B (bfloat16 in 16-column blocks, two consecutive reduction elements side by side: the layout
// TDPBF16PS reads, which the attention packs K and V in already). Only for code that has checked
// amx_usable() (cpu_features.h): the tile instructions fault on a CPU or a process without them.
//
// One configuration serves every product (amx_tile_config.h, loaded per call): eight tiles of 16 rows x 64
// bytes. C blocks of 2 x 2 tiles
// (tmm0-3, 32 rows x 32 columns) are fed by two A tiles (tmm4-5: 16 rows x 32 bf16) and two B tiles (tmm6-7:
// 16 pairs x 16 columns); each step is 4 loads for 4 TDPBF16PS, which L1 and L2 keep up with.
#pragma once

#if defined(__AVX512BF16__)

#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/amx_tile_config.h"

namespace kiln::cpu_kernels::KILN_ISA::amx {

// Rows per A or C tile, columns per B or C tile, and bf16 elements of the reduction per tile step.
inline constexpr int64_t kTileRows = 16;
inline constexpr int64_t kTileCols = 16;
inline constexpr int64_t kTileK = 32;

// Returns the tiles to their initial state, so that the thread's context switches stop saving 8 KiB of them.
__attribute__((target("amx-tile"))) inline void release_tiles() {
  _tile_release();
}

// One block of MB x NB C tiles (MB, NB in {1, 2}) over k_steps steps of kTileK.
//   a: the block's first row; rows a_stride elements apart; step k at column k * kTileK.
//   b: the block's first 16-column block; blocks b_stride elements apart; step k at k * kTileK * 16.
//   c: the block's first element; rows c_stride floats apart. accumulate: C += A B, else C = A B.
template <int MB, int NB>
__attribute__((target("amx-tile,amx-bf16"))) inline void product_block(int64_t k_steps, const uint16_t* a,
                                                                       int64_t a_stride, const uint16_t* b,
                                                                       int64_t b_stride, float* c,
                                                                       int64_t c_stride, bool accumulate) {
  const int64_t a_bytes = a_stride * 2, c_bytes = c_stride * 4;
  float* c1 = c + kTileRows * c_stride;
  if (accumulate) {
    _tile_loadd(0, c, c_bytes);
    if constexpr (NB == 2) _tile_loadd(1, c + kTileCols, c_bytes);
    if constexpr (MB == 2) _tile_loadd(2, c1, c_bytes);
    if constexpr (MB == 2 && NB == 2) _tile_loadd(3, c1 + kTileCols, c_bytes);
  } else {
    _tile_zero(0);
    if constexpr (NB == 2) _tile_zero(1);
    if constexpr (MB == 2) _tile_zero(2);
    if constexpr (MB == 2 && NB == 2) _tile_zero(3);
  }
  const uint16_t* a1 = a + kTileRows * a_stride;
  const uint16_t* b1 = b + b_stride;
  // Each tile is loaded just before its first product, so that a product starts while the next load is in
  // flight: about 5% over four loads then four products on L1-resident operands in a microbenchmark, 0-3% on
  // whole GEMMs (4096 x 3072 x 3072 and the MLP shapes, 2 Xeon cores), within their noise.
  for (int64_t k = 0; k < k_steps; ++k) {
    _tile_loadd(4, a + k * kTileK, a_bytes);
    _tile_loadd(6, b + k * kTileK * kTileCols, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB == 2) {
      _tile_loadd(7, b1 + k * kTileK * kTileCols, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (MB == 2) {
      _tile_loadd(5, a1 + k * kTileK, a_bytes);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NB == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, c_bytes);
  if constexpr (NB == 2) _tile_stored(1, c + kTileCols, c_bytes);
  if constexpr (MB == 2) _tile_stored(2, c1, c_bytes);
  if constexpr (MB == 2 && NB == 2) _tile_stored(3, c1 + kTileCols, c_bytes);
}

// C [row_tiles * 16][col_tiles * 16] = or += A [row_tiles * 16][k_steps * 32] x B, with the operands laid out
// as product_block describes. Each pair of B column blocks stays in L1 while every row block passes over it.
inline void product(int64_t row_tiles, int64_t col_tiles, int64_t k_steps, const uint16_t* a,
                    int64_t a_stride, const uint16_t* b, int64_t b_stride, float* c, int64_t c_stride,
                    bool accumulate) {
  for (int64_t n = 0; n < col_tiles; n += 2) {
    const bool two_cols = n + 1 < col_tiles;
    for (int64_t m = 0; m < row_tiles; m += 2) {
      const bool two_rows = m + 1 < row_tiles;
      const uint16_t* am = a + m * kTileRows * a_stride;
      const uint16_t* bn = b + n * b_stride;
      float* cmn = c + m * kTileRows * c_stride + n * kTileCols;
      if (two_rows && two_cols)
        product_block<2, 2>(k_steps, am, a_stride, bn, b_stride, cmn, c_stride, accumulate);
      else if (two_rows)
        product_block<2, 1>(k_steps, am, a_stride, bn, b_stride, cmn, c_stride, accumulate);
      else if (two_cols)
        product_block<1, 2>(k_steps, am, a_stride, bn, b_stride, cmn, c_stride, accumulate);
      else
        product_block<1, 1>(k_steps, am, a_stride, bn, b_stride, cmn, c_stride, accumulate);
    }
  }
}

}  // namespace kiln::cpu_kernels::KILN_ISA::amx

#endif  // __AVX512BF16__
