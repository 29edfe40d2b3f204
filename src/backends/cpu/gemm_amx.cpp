// The AMX GEMM's blocking and threads (see gemm_amx.h); the packing and the tile loop are in
// isa/gemm_amx.cpp.
#include "backends/cpu/gemm_amx.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/gemm_blocking.h"
#include "kiln/core/error.h"

namespace kiln::cpu_kernels {

namespace {

// A depth slice of up to kMaxDepthBlock x kColBlock bf16 of packed weight (1 MiB) stays in L2 while every
// 32-row strip of the block passes over it. kRowBlock sets how often the weight is packed (M / kRowBlock
// times: each packed tile then feeds kRowBlock / 16 TDPBF16PS). The block's accumulators (kRowBlock x
// kColBlock floats, 2 MiB, more than L2) go through the tiles once per depth slice, so K is cut into as few
// slices as that L2 budget allows, of equal depth: 512-deep slices spent about a fifth of the tile loop
// loading and storing accumulators, and 1536- to 2048-deep ones ran the bench_matmul shapes 10-25% faster
// and DiT steps 4-9% faster on a Xeon with AMX under load from other tenants (docs/performance.md); 3072
// deep (the weight slice past L2) was slower again.
constexpr int64_t kMaxDepthBlock = 2048;
constexpr int64_t kColBlock = 256;
constexpr int64_t kRowBlock = 2048;
constexpr int64_t kMinRowBlock = 256;
constexpr int64_t kItemsPerThread = 4;
constexpr int64_t kStep = 32;  // K elements per tile step

}  // namespace

bool gemm_amx_takes(const Bf16Gemm& g) {
  return g.x_col_stride == 1 && g.k % kStep == 0 && g.k > 0;
}

void gemm_amx(const Bf16Gemm& g) {
  KILN_CHECK(amx_usable() && gemm_amx_takes(g),
             "linear: internal: the AMX GEMM was given a product it does not take (K "
                 << g.k << ", x column stride " << g.x_col_stride << ")");
  const int max_threads = omp_get_max_threads();
  const int64_t col_block = std::min(kColBlock, round_up(g.n, 16));
  const int64_t col_blocks = ceil_div(g.n, col_block);
  const int64_t row_block =
      gemm_row_block(g.m, col_blocks, max_threads, kRowBlock, kMinRowBlock, 16, kItemsPerThread);
  const int64_t depth_block = round_up(ceil_div(g.k, ceil_div(g.k, kMaxDepthBlock)), kStep);
  const int64_t row_blocks = ceil_div(g.m, row_block);
  const int64_t items = row_blocks * col_blocks;
  const int threads = static_cast<int>(std::min<int64_t>(max_threads, items));
  const size_t panel_bytes = g.w_amx_tiles != nullptr ? 0 : static_cast<size_t>(depth_block * col_block) * 2;
  const size_t edge_bytes = static_cast<size_t>(32 * (depth_block + kStep)) * 2;
  const size_t acc_bytes = static_cast<size_t>(round_up(row_block, 16) * col_block) * 4;

  // Items run row block by row block, so that the threads share the rows of x they read (from L3).
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
  for (int64_t item = 0; item < items; ++item) {
    thread_local GemmThreadBuffer buffer;
    char* base = buffer.get(panel_bytes + edge_bytes + acc_bytes);
    uint16_t* panel = reinterpret_cast<uint16_t*>(base);
    uint16_t* edge = reinterpret_cast<uint16_t*>(base + panel_bytes);
    float* acc = reinterpret_cast<float*>(base + panel_bytes + edge_bytes);
    const int64_t m0 = item / col_blocks * row_block, n0 = item % col_blocks * col_block;
    const int64_t rows = std::min(row_block, g.m - m0), cols = std::min(col_block, g.n - n0);
    const int64_t panel_cols = round_up(cols, 16);
    const BlockColumns columns{n0, cols};
    for (int64_t k0 = 0; k0 < g.k; k0 += depth_block) {
      const int64_t depth = std::min(depth_block, g.k - k0);
      const BlockColumns* finish = k0 + depth == g.k ? &columns : nullptr;
      if (g.w_amx_tiles != nullptr) {
        const uint16_t* slice = g.w_amx_tiles + n0 * g.k + k0 * 16;
        avx512::amx_block(g, m0, rows, k0, depth, slice, g.k * 16, panel_cols, acc, panel_cols, k0 > 0, edge,
                          finish);
      } else {
        avx512::amx_pack_weights(g, n0, cols, k0, depth, panel);
        avx512::amx_block(g, m0, rows, k0, depth, panel, depth * 16, panel_cols, acc, panel_cols, k0 > 0,
                          edge, finish);
      }
    }
  }
}

}  // namespace kiln::cpu_kernels
