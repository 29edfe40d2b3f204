// The f32-FMA GEMM's blocking and threads (see gemm_fma32.h); the packing and the micro-kernel are per ISA
// (isa/gemm_fma32.cpp).
#include "backends/cpu/gemm_fma32.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "backends/cpu/gemm_blocking.h"
#include "kiln/core/error.h"

namespace kiln::cpu_kernels {

namespace {

// kDepthBlock x kColBlock floats of packed weight (576 KiB) stay in a 1-2 MiB L2 while every row strip of
// the block passes over them; a strip (mr x kDepthBlock floats, 12 KiB) stays in L1 while it crosses all the
// panels. kRowBlock sets how often the weight is widened (M / kRowBlock times), kColBlock how often x is
// (N / kColBlock times): each widened float then feeds 2 * 2048 or 2 * 384 FLOPs. The block's accumulators
// (kRowBlock x kColBlock floats, 3 MiB) live in L3; each tile of them is touched once per depth block and
// prefetched a tile ahead. Tuned on a Zen 4 core (1 thread, 2048 x 3072 x 3072, within the host's noise of
// 4%): depth 384 over 256 +2%, 2048 rows over 1024 +2%; 320-512 deep and 240-576 wide all within 4%.
constexpr int64_t kDepthBlock = 384;
constexpr int64_t kColBlock = 384;
constexpr int64_t kRowBlock = 2048;
constexpr int64_t kMinRowBlock = 256;
constexpr int64_t kItemsPerThread = 4;

}  // namespace

void gemm_fma32(const Bf16Gemm& g, bool avx512) {
  const Fma32Tile tile = avx512 ? avx512::fma32_tile() : generic::fma32_tile();
  const auto pack = avx512 ? avx512::fma32_pack_weights : generic::fma32_pack_weights;
  const auto block = avx512 ? avx512::fma32_block : generic::fma32_block;

  const int max_threads = omp_get_max_threads();
  const int64_t col_block = std::min(round_up(kColBlock, tile.nr), round_up(g.n, tile.nr));
  const int64_t col_blocks = ceil_div(g.n, col_block);
  const int64_t row_block =
      gemm_row_block(g.m, col_blocks, max_threads, kRowBlock, kMinRowBlock, tile.mr, kItemsPerThread);
  const int64_t depth_block = std::min(kDepthBlock, g.k);
  const int64_t row_blocks = ceil_div(g.m, row_block);
  const int64_t items = row_blocks * col_blocks;
  const int threads = static_cast<int>(std::min<int64_t>(max_threads, items));
  const size_t panel_floats = static_cast<size_t>(depth_block * col_block);
  const size_t strip_floats = static_cast<size_t>(tile.mr * depth_block);
  const size_t acc_floats = static_cast<size_t>(row_block * col_block);

  // Items run row block by row block, so that the threads share the rows of x they read (from L3).
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
  for (int64_t item = 0; item < items; ++item) {
    thread_local GemmThreadBuffer buffer;
    float* panels =
        reinterpret_cast<float*>(buffer.get((panel_floats + strip_floats + acc_floats) * sizeof(float)));
    float* strip = panels + panel_floats;
    float* acc = strip + strip_floats;
    const int64_t m0 = item / col_blocks * row_block, n0 = item % col_blocks * col_block;
    const int64_t rows = std::min(row_block, g.m - m0), cols = std::min(col_block, g.n - n0);
    const int64_t panel_cols = round_up(cols, tile.nr);
    const BlockColumns columns{n0, cols};
    for (int64_t k0 = 0; k0 < g.k; k0 += depth_block) {
      const int64_t depth = std::min(depth_block, g.k - k0);
      pack(g, n0, cols, k0, depth, panels);
      block(g, m0, rows, k0, depth, panels, panel_cols, acc, panel_cols, k0 > 0, strip,
            k0 + depth == g.k ? &columns : nullptr);
    }
  }
}

}  // namespace kiln::cpu_kernels
