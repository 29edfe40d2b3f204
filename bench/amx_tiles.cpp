// What an AMX tile product costs once its operands come from memory: the evidence behind the AMX GEMM's and
// attention's data layout (docs/performance.md). One thread, tiles configured as Kiln's kernels do (eight of
// 16 rows x 64 bytes), the GEMM's 2 x 2 block of accumulators (tmm0-3) fed by two x tiles (tmm4-5) and two
// weight tiles (tmm6-7) per 32-deep step, 4 TDPBF16PS per step. Each regime prints GFLOP/s and its share of
// the register-only rate (no loads at all):
//   - every operand tile in L1, rows on cache lines, then the same rows 16 bytes past a line;
//   - x tiles in L1 and the weight streamed from a 1 MiB buffer (L2), as one packed panel is;
//   - the GEMM's own pattern: a 32-row strip of x with rows 6 KiB apart (K = 3072) swept across 8 weight
//     column pairs of a 1536-deep slice, both from L2, with and without software prefetching of the
//     tiles two steps ahead.
// Usage: taskset -c 0 bench_amx_tiles [repetitions=5]   (needs AMX; says so and exits 0 without it)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/cpu/amx_tile_config.h"
#include "backends/cpu/cpu_features.h"
#include "bench_util.h"

namespace {

constexpr int64_t kStepBytes = 1024;  // one tile: 16 rows x 64 bytes

// A 4096-byte aligned buffer of bf16 ones, freed at the end of the scope.
struct Buffer {
  explicit Buffer(size_t bytes) : data(static_cast<char*>(std::aligned_alloc(4096, bytes))) {
    for (size_t i = 0; i + 1 < bytes; i += 2) {
      data[i] = static_cast<char>(0x80);
      data[i + 1] = 0x3f;
    }
  }
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data;
};

__attribute__((target("amx-tile"))) void zero_accumulators() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

__attribute__((target("amx-tile,amx-bf16"))) void register_only(int64_t steps) {
  for (int64_t s = 0; s < steps; ++s) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

// One 2 x 2 step in the GEMM's order (isa/amx_tiles.h, block_steps): x tiles at a0, a1 (rows a_stride bytes
// apart), weight tiles at b0, b1 (rows 64 bytes apart).
__attribute__((target("amx-tile,amx-bf16"), always_inline)) inline void step(const char* a0, const char* a1,
                                                                             int64_t a_stride, const char* b0,
                                                                             const char* b1) {
  _tile_loadd(4, a0, a_stride);
  _tile_loadd(6, b0, 64);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(7, b1, 64);
  _tile_dpbf16ps(1, 4, 7);
  _tile_loadd(5, a1, a_stride);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

// All four tiles from a 32 KiB region (L1), `skew` bytes past 64-byte alignment.
__attribute__((target("amx-tile,amx-bf16"))) void from_l1(const char* base, int64_t skew, int64_t steps) {
  for (int64_t s = 0; s < steps; ++s) {
    const char* p = base + skew + (s & 7) * 4 * kStepBytes;
    step(p, p + kStepBytes, 64, p + 2 * kStepBytes, p + 3 * kStepBytes);
  }
}

// x tiles from a 16 KiB region (L1), the weight's tile pairs streamed in order through `w_bytes`.
__attribute__((target("amx-tile,amx-bf16"))) void weight_streamed(const char* x, const char* w,
                                                                  int64_t w_bytes, int64_t steps) {
  const int64_t pairs = w_bytes / (2 * kStepBytes);
  for (int64_t s = 0; s < steps; ++s) {
    const char* a = x + (s & 7) * 2 * kStepBytes;
    const char* b = w + (s % pairs) * 2 * kStepBytes;
    step(a, a + kStepBytes, 64, b, b + kStepBytes);
  }
}

// The GEMM's sweep of one 32-row strip of x (rows x_stride bytes apart, `depth` deep) across 8 column pairs
// of a packed weight slice (16-column groups depth * 32 bytes apart), accumulators stored after each pair.
template <bool kPrefetch>
__attribute__((target("amx-tile,amx-bf16"))) void gemm_strip(const char* x, int64_t x_stride, const char* w,
                                                             int64_t depth, float* c) {
  const int64_t steps = depth / 32, group_bytes = depth * 32;
  const char* x1 = x + 16 * x_stride;
  for (int64_t pair = 0; pair < 8; ++pair) {
    const char* b0 = w + 2 * pair * group_bytes;
    const char* b1 = b0 + group_bytes;
    zero_accumulators();
    for (int64_t s = 0; s < steps; ++s) {
      if constexpr (kPrefetch) {
        if (s + 2 < steps) {
          for (int r = 0; r < 16; ++r) {
            _mm_prefetch(x + r * x_stride + (s + 2) * 64, _MM_HINT_T0);
            _mm_prefetch(x1 + r * x_stride + (s + 2) * 64, _MM_HINT_T0);
            _mm_prefetch(b0 + (s + 2) * kStepBytes + r * 64, _MM_HINT_T0);
            _mm_prefetch(b1 + (s + 2) * kStepBytes + r * 64, _MM_HINT_T0);
          }
        }
      }
      step(x + s * 64, x1 + s * 64, x_stride, b0 + s * kStepBytes, b1 + s * kStepBytes);
    }
    float* cp = c + pair * 32;
    _tile_stored(0, cp, 256 * 4);
    _tile_stored(1, cp + 16, 256 * 4);
    _tile_stored(2, cp + 16 * 256, 256 * 4);
    _tile_stored(3, cp + 16 * 256 + 16, 256 * 4);
  }
}

__attribute__((target("amx-tile"))) void release_tiles() {
  _tile_release();
}

// Best GFLOP/s of `reps` runs of f, which issues `products` tile products.
template <class F>
double rate(int reps, double products, F f) {
  double best = 0;
  f();
  for (int r = 0; r < reps; ++r) {
    const double seconds = kiln::bench::time_of(f).wall;
    best = std::max(best, products * 16 * 16 * 32 * 2 / seconds * 1e-9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  if (!kiln::cpu_kernels::amx_usable()) {
    std::printf("bench_amx_tiles: this CPU (or this process) has no AMX tiles; nothing to measure\n");
    return 0;
  }
  kiln::cpu_kernels::load_amx_tile_config();
  constexpr int64_t kSteps = 1 << 18;
  Buffer l1(48 * 1024), weight(1 << 20), strip_x(32 * 6144), slice(1536 * 256 * 2);
  float* acc = static_cast<float*>(std::aligned_alloc(4096, 32 * 256 * 4));
  zero_accumulators();
  const double reg = rate(reps, 4.0 * kSteps, [&] { register_only(kSteps); });
  std::printf("AMX tile products, 1 thread, best of %d, GFLOP/s (share of register-only)\n", reps);
  const auto line = [&](const char* what, double gflops) {
    std::printf("  %-78s %6.0f (%3.0f%%)\n", what, gflops, 100 * gflops / reg);
  };
  line("register-only: 4 TDPBF16PS per step, no loads", reg);
  line("4 tile loads per step from L1, rows on cache lines",
       rate(reps, 4.0 * kSteps, [&] { from_l1(l1.data, 0, kSteps); }));
  line("the same, rows 16 bytes past a line",
       rate(reps, 4.0 * kSteps, [&] { from_l1(l1.data, 16, kSteps); }));
  line("x tiles from L1, the weight streamed from 1 MiB (L2)",
       rate(reps, 4.0 * kSteps, [&] { weight_streamed(l1.data, weight.data, 1 << 20, kSteps); }));
  // A strip of x of K = 3072 (rows 6 KiB apart), one 1536-deep slice of a 256-column packed weight (768 KiB).
  const int64_t depth = 1536, strips = 64;
  const double strip_products = 8.0 * 4 * (depth / 32) * strips;
  line("GEMM pattern: x strip (rows 6 KiB apart) x 8 weight pairs, both from L2",
       rate(reps, strip_products, [&] {
         for (int64_t i = 0; i < strips; ++i) gemm_strip<false>(strip_x.data, 6144, slice.data, depth, acc);
       }));
  line("the same, every tile prefetched into L1 two steps ahead", rate(reps, strip_products, [&] {
         for (int64_t i = 0; i < strips; ++i) gemm_strip<true>(strip_x.data, 6144, slice.data, depth, acc);
       }));
  release_tiles();
  std::free(acc);
  return 0;
}
