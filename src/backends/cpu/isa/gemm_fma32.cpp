// The f32-FMA GEMM's packing and micro-kernel (the blocking and threads are gemm_fma32.cpp's).
// The micro-kernel keeps an MR x NR tile of float32 accumulators in registers; each step along K loads NR
// packed weight floats (NR / 16 vectors, from the L2-resident panel), broadcasts MR widened x values (from
// the L1-resident strip) and issues MR * NR / 16 FMAs.
#include <algorithm>
#include <array>
#include <utility>

#include "backends/cpu/gemm_fma32.h"
#include "backends/cpu/isa/transpose16.h"
#include "backends/cpu/isa/vec.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {

// AVX-512: 8 x 48 = 24 accumulators + 3 weight vectors + 1 broadcast of the 32 zmm registers; 11 loads per
// 24 FMAs leaves the load ports idle half the time on cores with two FMA units, and the 48-float panel row
// (192 bytes) is the only data streamed from L2. Portable: a 16-float vector is four SSE registers, so 3 x 16
// (as in attention_tile.cpp) keeps the tile in 16 registers.
#if defined(__AVX512F__)
constexpr int kMR = 8;
constexpr int kNV = 3;
#else
constexpr int kMR = 3;
constexpr int kNV = 1;
#endif
constexpr int kNR = kNV * kLanes;

template <int MR>
void micro_kernel(int64_t depth, const float* __restrict a, int64_t a_stride, const float* __restrict b,
                  float* __restrict c, int64_t c_stride, bool accumulate) {
  f32x16 acc[MR][kNV];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) acc[m][v] = accumulate ? load(c + m * c_stride + v * kLanes) : splat(0.0f);
  }
#pragma GCC unroll 2
  for (int64_t k = 0; k < depth; ++k) {
    f32x16 bv[kNV];
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) bv[v] = load(b + k * kNR + v * kLanes);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const f32x16 av = splat(a[m * a_stride + k]);
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) acc[m][v] = vfma(av, bv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) store(c + m * c_stride + v * kLanes, acc[m][v]);
  }
}

using MicroKernel = void (*)(int64_t, const float*, int64_t, const float*, float*, int64_t, bool);

template <size_t... I>
constexpr std::array<MicroKernel, sizeof...(I)> make_kernels(std::index_sequence<I...>) {
  return {&micro_kernel<static_cast<int>(I) + 1>...};
}

// GCC 12's dead-code elimination drops __builtin_prefetch in loops like these (attention_tile.cpp); an asm
// statement stays. Level 1 requests the line into L1; level 2 into L2 only, for lines needed thousands of
// cycles later: the weight panels stream through L1 meanwhile and would evict them from there.
template <int Level>
inline void prefetch(const void* p) {
#if defined(__x86_64__)
  if constexpr (Level == 1)
    asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
  else
    asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, Level == 1 ? 3 : 2);
#endif
}

// Requests `bytes` from `p`. The rows of x and of the weight that a block reads are each on their own page
// (rows are kilobytes apart), where the hardware prefetcher does not follow: without this, widening x and
// packing the weight waited on L3 or DRAM for every row (10% of the time at 4096 x 3072 x 3072).
template <int Level>
inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) prefetch<Level>(c + b);
  prefetch<Level>(c + bytes - 1);
}

// Panel columns [0, 16) (at `dst`, rows kNR floats apart) from 16 weight rows of `depth` bf16 each
// (`src`, `row_stride` elements apart): dst[k * kNR + r] = src[r * row_stride + k].
void pack_row_group(const bf16_t* src, int64_t row_stride, int64_t depth, float* dst) {
  int64_t k = 0;
  for (; k + kLanes <= depth; k += kLanes) {
    f32x16 v[kLanes];
#pragma GCC unroll 16
    for (int r = 0; r < kLanes; ++r) v[r] = load(src + r * row_stride + k);
    transpose_16x16(v);
#pragma GCC unroll 16
    for (int c = 0; c < kLanes; ++c) store(dst + (k + c) * kNR, v[c]);
  }
  for (; k < depth; ++k) {
    for (int r = 0; r < kLanes; ++r) dst[k * kNR + r] = bf16_to_f32(src[r * row_stride + k]);
  }
}

// Rows [m0, m0 + rows) x K range [k0, k0 + depth) of x, widened into strip[r * depth + k].
void widen_rows(const Bf16Gemm& g, int64_t m0, int64_t rows, int64_t k0, int64_t depth, float* strip) {
  const bf16_t* x = static_cast<const bf16_t*>(g.x);
  for (int64_t r = 0; r < rows; ++r) {
    const bf16_t* src = x + (m0 + r) * g.x_row_stride + k0 * g.x_col_stride;
    float* dst = strip + r * depth;
    int64_t k = 0;
    if (g.x_col_stride == 1) {
      for (; k + kLanes <= depth; k += kLanes) store(dst + k, load(src + k));
    }
    for (; k < depth; ++k) dst[k] = bf16_to_f32(src[k * g.x_col_stride]);
  }
}

}  // namespace

Fma32Tile fma32_tile() {
  return {kMR, kNR};
}

void fma32_pack_weights(const Bf16Gemm& g, int64_t n0, int64_t cols, int64_t k0, int64_t depth,
                        float* panels) {
  const bf16_t* w = static_cast<const bf16_t*>(g.w);
  for (int64_t p = 0; p < cols; p += kNR) {
    float* panel = panels + p * depth;
    const int64_t lanes = std::min<int64_t>(kNR, cols - p);
    if (g.w_col_stride == 1) {
      // Weight rows are contiguous along K: 16 rows at a time, 16 x 16 blocks widened and transposed in
      // registers; the last columns of a partial panel one row at a time.
      int64_t j = 0;
      for (; j + kLanes <= lanes; j += kLanes) {
        const bf16_t* src = w + (n0 + p + j) * g.w_row_stride + k0;
        for (int64_t r = 0; r < kLanes; ++r) {
          if (p + j + r + kLanes < cols) prefetch_bytes<1>(src + (r + kLanes) * g.w_row_stride, depth * 2);
        }
        pack_row_group(src, g.w_row_stride, depth, panel + j);
      }
      for (; j < lanes; ++j) {
        const bf16_t* src = w + (n0 + p + j) * g.w_row_stride + k0;
        for (int64_t k = 0; k < depth; ++k) panel[k * kNR + j] = bf16_to_f32(src[k]);
      }
    } else {
      // Column-major weight: consecutive weight rows are adjacent, so each panel row is one read.
      for (int64_t k = 0; k < depth; ++k) {
        const bf16_t* src = w + (n0 + p) * g.w_row_stride + (k0 + k) * g.w_col_stride;
        for (int64_t j = 0; j < lanes; ++j) panel[k * kNR + j] = bf16_to_f32(src[j * g.w_row_stride]);
      }
    }
    if (lanes < kNR) {
      for (int64_t k = 0; k < depth; ++k) std::fill(panel + k * kNR + lanes, panel + (k + 1) * kNR, 0.0f);
    }
  }
}

void fma32_block(const Bf16Gemm& g, int64_t m0, int64_t rows, int64_t k0, int64_t depth, const float* panels,
                 int64_t panel_cols, float* acc, int64_t acc_stride, bool accumulate, float* strip,
                 const BlockColumns* finish) {
  static constexpr auto kernels = make_kernels(std::make_index_sequence<kMR>());
  const bf16_t* x = static_cast<const bf16_t*>(g.x);
  for (int64_t r = 0; r < rows; r += kMR) {
    const int mr = static_cast<int>(std::min<int64_t>(kMR, rows - r));
    widen_rows(g, m0 + r, mr, k0, depth, strip);
    // The next strip's rows arrive while this one crosses the panels (for a row-major x; others are rare),
    // a few rows per panel: requesting them all at once stalled on the core's outstanding-miss limit.
    const int64_t next_rows =
        g.x_col_stride == 1 ? std::max<int64_t>(0, std::min<int64_t>(kMR, rows - r - kMR)) : 0;
    const int64_t panel_count = panel_cols / kNR;
    const int64_t per_panel = (next_rows + panel_count - 1) / panel_count;
    for (int64_t p = 0, i = 0; p < panel_cols; p += kNR) {
      for (const int64_t end = std::min(next_rows, i + per_panel); i < end; ++i)
        prefetch_bytes<2>(x + (m0 + r + kMR + i) * g.x_row_stride + k0, depth * 2);
      // The accumulators of the next tile (in L3: a block's are larger than L2) arrive during this one.
      if (accumulate && p + kNR < panel_cols) {
        for (int m = 0; m < mr; ++m) prefetch_bytes<2>(acc + (r + m) * acc_stride + p + kNR, kNR * 4);
      }
      kernels[mr - 1](depth, strip, depth, panels + p * depth, acc + r * acc_stride + p, acc_stride,
                      accumulate);
    }
    if (finish != nullptr) {
      linear_epilogue_rows(acc + r * acc_stride, acc_stride, m0 + r, mr, finish->n0, finish->cols, g.epilogue,
                           g.out, g.out_dtype, g.out_row_stride);
    }
  }
}

}  // namespace kiln::cpu_kernels::KILN_ISA
