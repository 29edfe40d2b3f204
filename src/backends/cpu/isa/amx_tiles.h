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

#include <algorithm>
#include <cstdint>
#include <type_traits>

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

// One block of MB x NB C tiles (MB, NB in {1, 2}), in three parts so that a product can be issued a few
// steps at a time (SteppedProduct): block_start loads or zeroes the accumulators (tmm0-3), block_steps runs
// steps [k0, k1) of kTileK, block_store writes the accumulators back. The tiles keep the accumulators in
// between; nothing else may use them until block_store.
//   a: the block's first row; rows a_stride elements apart; step k at column k * kTileK.
//   b: the block's first 16-column block; blocks b_stride elements apart; step k at k * kTileK * 16.
//   c: the block's first element; rows c_stride floats apart. accumulate: C += A B, else C = A B.
template <int MB, int NB>
__attribute__((target("amx-tile"))) inline void block_start(float* c, int64_t c_stride, bool accumulate) {
  const int64_t c_bytes = c_stride * 4;
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
}

template <int MB, int NB>
__attribute__((target("amx-tile,amx-bf16"))) inline void block_steps(int64_t k0, int64_t k1,
                                                                     const uint16_t* a, int64_t a_stride,
                                                                     const uint16_t* b, int64_t b_stride) {
  const int64_t a_bytes = a_stride * 2;
  const uint16_t* a1 = a + kTileRows * a_stride;
  const uint16_t* b1 = b + b_stride;
  // Each tile is loaded just before its first product, so that a product starts while the next load is in
  // flight: about 5% over four loads then four products on L1-resident operands in a microbenchmark, 0-3% on
  // whole GEMMs (4096 x 3072 x 3072 and the MLP shapes, 2 Xeon cores), within their noise.
  for (int64_t k = k0; k < k1; ++k) {
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
}

template <int MB, int NB>
__attribute__((target("amx-tile"))) inline void block_store(float* c, int64_t c_stride) {
  const int64_t c_bytes = c_stride * 4;
  float* c1 = c + kTileRows * c_stride;
  _tile_stored(0, c, c_bytes);
  if constexpr (NB == 2) _tile_stored(1, c + kTileCols, c_bytes);
  if constexpr (MB == 2) _tile_stored(2, c1, c_bytes);
  if constexpr (MB == 2 && NB == 2) _tile_stored(3, c1 + kTileCols, c_bytes);
}

// Calls f(std::integral_constant<int, MB>, std::integral_constant<int, NB>) for mb, nb in {1, 2}.
template <class F>
inline void with_block_shape(int64_t mb, int64_t nb, F&& f) {
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  if (mb == 2 && nb == 2)
    f(Two{}, Two{});
  else if (mb == 2)
    f(Two{}, One{});
  else if (nb == 2)
    f(One{}, Two{});
  else
    f(One{}, One{});
}

// C [row_tiles * 16][col_tiles * 16] = or += A [row_tiles * 16][k_steps * 32] x B, with the operands laid out
// as block_steps describes, in 2 x 2 blocks (each pair of B column blocks stays in L1 while every row block
// passes over it), issued a few tile products at a time by advance() or all at once by finish(). Between two
// calls the AMX unit works through what was issued while the caller's
// vector code runs (the attention overlaps its softmax with the products of the key tiles before and after).
// The tiles hold the current block's accumulators between calls: nothing else may use them until finish().
class SteppedProduct {
 public:
  SteppedProduct() = default;
  SteppedProduct(int64_t row_tiles, int64_t col_tiles, int64_t k_steps, const uint16_t* a, int64_t a_stride,
                 const uint16_t* b, int64_t b_stride, float* c, int64_t c_stride, bool accumulate)
      : row_tiles_(row_tiles),
        col_tiles_(col_tiles),
        k_steps_(k_steps),
        a_(a),
        a_stride_(a_stride),
        b_(b),
        b_stride_(b_stride),
        c_(c),
        c_stride_(c_stride),
        accumulate_(accumulate),
        remaining_(row_tiles * col_tiles * k_steps) {}

  // Tile products (TDPBF16PS) not issued yet.
  int64_t remaining() const { return remaining_; }

  // Issues at least `products` tile products (whole steps of the current block), or all that remain;
  // returns how many it issued.
  int64_t advance(int64_t products) {
    const int64_t before = remaining_;
    while (products > 0 && remaining_ > 0) {
      const int64_t mb = std::min<int64_t>(2, row_tiles_ - m_), nb = std::min<int64_t>(2, col_tiles_ - n_);
      const uint16_t* am = a_ + m_ * kTileRows * a_stride_;
      const uint16_t* bn = b_ + n_ * b_stride_;
      float* cmn = c_ + m_ * kTileRows * c_stride_ + n_ * kTileCols;
      const int64_t per_step = mb * nb;
      const int64_t steps = std::min(k_steps_ - k_, (products + per_step - 1) / per_step);
      const int64_t k0 = k_;
      k_ += steps;
      const bool last = k_ == k_steps_;
      with_block_shape(mb, nb, [&](auto mbc, auto nbc) {
        if (k0 == 0) block_start<mbc(), nbc()>(cmn, c_stride_, accumulate_);
        block_steps<mbc(), nbc()>(k0, k0 + steps, am, a_stride_, bn, b_stride_);
        if (last) block_store<mbc(), nbc()>(cmn, c_stride_);
      });
      products -= steps * per_step;
      remaining_ -= steps * per_step;
      if (last) {
        k_ = 0;
        m_ += 2;
        if (m_ >= row_tiles_) {
          m_ = 0;
          n_ += 2;
        }
      }
    }
    return before - remaining_;
  }

  void finish() { advance(remaining_); }

 private:
  int64_t row_tiles_ = 0, col_tiles_ = 0, k_steps_ = 0;
  const uint16_t* a_ = nullptr;
  int64_t a_stride_ = 0;
  const uint16_t* b_ = nullptr;
  int64_t b_stride_ = 0;
  float* c_ = nullptr;
  int64_t c_stride_ = 0;
  bool accumulate_ = false;
  int64_t remaining_ = 0;
  int64_t m_ = 0, n_ = 0, k_ = 0;  // the current block's first row and column tile, and its next step
};

}  // namespace kiln::cpu_kernels::KILN_ISA::amx

#endif  // __AVX512BF16__
