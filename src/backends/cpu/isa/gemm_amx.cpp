// The AMX GEMM's weight packing and tile loop (the blocking and threads are gemm_amx.cpp's). Built in the
// AVX-512 variant only: the portable variant has no tiles, and the driver never calls it there.
#if defined(__AVX512BF16__)

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/isa/amx_tiles.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {

// GCC 12 drops __builtin_prefetch in loops like these (attention_tile.cpp); an asm statement stays.
inline void prefetch(const void* p) {
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
}

// r[i][j] -> r[j][i] for a 16 x 16 matrix of 32-bit elements (bf16 pairs), in 64 shuffles: pairs of rows
// interleaved by 32 and then 64 bits leave 4 x 4 transposed blocks in each 128-bit lane; two rounds of lane
// shuffles put the blocks in place. (The maskz forms with every lane kept: GCC 12 warns that the plain ones
// read an uninitialized register.)
inline __m512i unpacklo32(__m512i a, __m512i b) {
  return _mm512_maskz_unpacklo_epi32(0xffff, a, b);
}
inline __m512i unpackhi32(__m512i a, __m512i b) {
  return _mm512_maskz_unpackhi_epi32(0xffff, a, b);
}
inline __m512i unpacklo64(__m512i a, __m512i b) {
  return _mm512_maskz_unpacklo_epi64(0xff, a, b);
}
inline __m512i unpackhi64(__m512i a, __m512i b) {
  return _mm512_maskz_unpackhi_epi64(0xff, a, b);
}
#define KILN_LANES(a, b, imm) _mm512_maskz_shuffle_i32x4(0xffff, a, b, imm)

inline void transpose_16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = unpacklo32(r[i], r[i + 1]);
    t[i + 1] = unpackhi32(r[i], r[i + 1]);
  }
  // u[4g + c], lane L: column 4L + c of rows 4g .. 4g + 3.
  for (int g = 0; g < 16; g += 4) {
    u[g] = unpacklo64(t[g], t[g + 2]);
    u[g + 1] = unpackhi64(t[g], t[g + 2]);
    u[g + 2] = unpacklo64(t[g + 1], t[g + 3]);
    u[g + 3] = unpackhi64(t[g + 1], t[g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = KILN_LANES(u[c], u[4 + c], 0x44);  // lanes 0, 1 of rows 0-3 and 4-7
    const __m512i v1 = KILN_LANES(u[c], u[4 + c], 0xee);  // lanes 2, 3
    const __m512i w0 = KILN_LANES(u[8 + c], u[12 + c], 0x44);
    const __m512i w1 = KILN_LANES(u[8 + c], u[12 + c], 0xee);
    r[c] = KILN_LANES(v0, w0, 0x88);
    r[4 + c] = KILN_LANES(v0, w0, 0xdd);
    r[8 + c] = KILN_LANES(v1, w1, 0x88);
    r[12 + c] = KILN_LANES(v1, w1, 0xdd);
  }
}
#undef KILN_LANES

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
        __m512i r[16];
        for (int64_t c = 0; c < 16; ++c) {
          if (rows[c] == nullptr) {
            r[c] = _mm512_setzero_si512();
            continue;
          }
          const uint16_t* src = rows[c] + s * amx::kTileK;
          r[c] = _mm512_loadu_si512(src);
          if (s + 4 < steps) prefetch(src + 4 * amx::kTileK);
        }
        transpose_16x16(r);
        uint16_t* dst = group + s * amx::kTileK * 16;
        for (int c = 0; c < 16; ++c) _mm512_storeu_si512(dst + c * 32, r[c]);
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
               uint16_t* edge) {
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
  }
  amx::release_tiles();
}

}  // namespace kiln::cpu_kernels::avx512

#endif  // __AVX512BF16__
