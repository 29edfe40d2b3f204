// The AMX GEMM's weight packing and tile loop (the blocking and threads are gemm_amx.cpp's). Built in the
// AVX-512 variant only: the portable variant has no tiles, and the driver never calls it there.
#if defined(__AVX512BF16__)

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/isa/amx_tiles.h"
#include "backends/cpu/isa/transpose16.h"
#include "backends/cpu/isa/vec.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {

// GCC 12 drops __builtin_prefetch in loops like these (attention_tile.cpp); an asm statement stays.
inline void prefetch(const void* p) {
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
}

}  // namespace

}  // namespace kiln::cpu_kernels::KILN_ISA

namespace kiln::cpu_kernels::avx512 {

void amx_pack_weights(const Bf16Gemm& g, int64_t n0, int64_t cols, int64_t k0, int64_t depth,
                      uint16_t* panel) {
  const uint16_t* w = static_cast<const uint16_t*>(g.w);
  const int64_t steps = depth / amx::kTileK;
  for (int64_t j = 0; j * 16 < cols; ++j) {
    uint16_t* group = panel + j * depth * 16;
    const int64_t lanes = std::min<int64_t>(16, cols - j * 16);
    if (g.w_col_stride == 1) {
      // Each weight row gives 16 pairs per step; 16 rows transposed make one tile of the group.
      const uint16_t* rows[16];
      for (int64_t c = 0; c < 16; ++c)
        rows[c] = c < lanes ? w + (n0 + j * 16 + c) * g.w_row_stride + k0 : nullptr;
      for (int64_t s = 0; s < steps; ++s) {
        // The bf16 pairs moved as 32-bit lanes of float vectors: shuffles move bits, whatever they mean.
        f32x16 r[16];
        for (int64_t c = 0; c < 16; ++c) {
          if (rows[c] == nullptr) {
            r[c] = splat(0.0f);
            continue;
          }
          const uint16_t* src = rows[c] + s * amx::kTileK;
          r[c] = load_bits(src);
          if (s + 4 < steps) prefetch(src + 4 * amx::kTileK);
        }
        transpose_16x16(r);
        uint16_t* dst = group + s * amx::kTileK * 16;
        for (int c = 0; c < 16; ++c) store_bits(dst + c * 32, r[c]);
      }
    } else {
      // Any other layout (a transposed view): element by element.
      for (int64_t k = 0; k < depth; ++k) {
        uint16_t* dst = group + (k / 2) * 32 + k % 2;
        for (int64_t c = 0; c < 16; ++c) {
          dst[c * 2] = c < lanes ? w[(n0 + j * 16 + c) * g.w_row_stride + (k0 + k) * g.w_col_stride] : 0;
        }
      }
    }
  }
}

void amx_block(const Bf16Gemm& g, int64_t m0, int64_t rows, int64_t k0, int64_t depth, const uint16_t* panel,
               int64_t group_stride, int64_t panel_cols, float* acc, int64_t acc_stride, bool accumulate,
               uint16_t* edge, const BlockColumns* finish) {
  const uint16_t* x = static_cast<const uint16_t*>(g.x);
  const int64_t steps = depth / amx::kTileK;
  const int64_t col_tiles = panel_cols / amx::kTileCols;
  // A tile row that straddles two cache lines makes every load of the tile slower: x read in place at 424
  // bytes past a line ran whole GEMMs 18-30% slower (docs/performance.md). Such an x (a view at an odd
  // offset, a mapped input) is read through the aligned edge buffer, a strip at a time.
  const bool x_aligned = reinterpret_cast<uintptr_t>(x) % 64 == 0 &&
                         (g.x_row_stride * static_cast<int64_t>(sizeof(uint16_t))) % 64 == 0;
  load_amx_tile_config();
  for (int64_t r = 0; r < rows; r += 32) {
    const int64_t here = std::min<int64_t>(32, rows - r);
    const uint16_t* a = x + (m0 + r) * g.x_row_stride + k0;
    int64_t a_stride = g.x_row_stride;
    if (here % 16 != 0 || !x_aligned) {
      // A tile reads 16 rows: the last few rows are copied with zeros below them. The copies are a line more
      // than `depth` apart, so that the rows of a strip do not all fall in the same L1 sets (a 2048-deep
      // slice is 4 KiB; in a microbenchmark, 32 rows 4096 bytes apart loaded ~10% slower than 4160 apart).
      const int64_t padded = (here + 15) / 16 * 16;
      const int64_t edge_stride = depth + amx::kTileK;
      for (int64_t i = 0; i < padded; ++i) {
        uint16_t* dst = edge + i * edge_stride;
        if (i < here)
          std::memcpy(dst, a + i * g.x_row_stride, static_cast<size_t>(depth) * 2);
        else
          std::memset(dst, 0, static_cast<size_t>(depth) * 2);
      }
      a = edge;
      a_stride = edge_stride;
    }
    amx::SteppedProduct(here > 16 ? 2 : 1, col_tiles, steps, a, a_stride, panel, group_stride,
                        acc + r * acc_stride, acc_stride, accumulate)
        .finish();
    if (finish != nullptr) {
      linear_epilogue_rows(acc + r * acc_stride, acc_stride, m0 + r, here, finish->n0, finish->cols,
                           g.epilogue, g.out, g.out_dtype, g.out_row_stride);
    }
  }
  amx::release_tiles();
}

}  // namespace kiln::cpu_kernels::avx512

#endif  // __AVX512BF16__
