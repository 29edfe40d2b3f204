// The interface between the attention driver (attention.cpp: threads, tiling, packing per head) and the
// per-ISA tile kernels (isa/attention_tile.cpp: micro-kernels and the online softmax of one query tile).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/cpu/isa_dispatch.h"
#include "kiln/core/dtype.h"

namespace kiln::cpu_kernels {

// How the two products run. F32: operands packed as float, FMA. BF16: operands packed as bfloat16 with two
// consecutive elements of the reduction dimension side by side, the layout VDPBF16PS multiplies pairwise
// into float accumulators.
enum class AttnMath : uint8_t { F32, BF16 };

// Keys (in packed K) and value columns (in packed V) come in blocks of one 16-float vector.
inline constexpr int64_t kAttnBlock = 16;
// With AMX tiles (BF16 math only), a tile step multiplies 32 bf16 elements of the reduction: D and the keys
// are padded to multiples of kAttnAmxStep, and each query tile's rows to a multiple of 16 (zero rows).
inline constexpr int64_t kAttnAmxStep = 32;

inline int64_t attn_pair(AttnMath math) {
  return math == AttnMath::BF16 ? 2 : 1;
}
inline size_t attn_elem_size(AttnMath math) {
  return math == AttnMath::BF16 ? 2 : 4;
}
inline int64_t attn_round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// A row-major matrix in its stored dtype, rows `row_stride` elements apart, columns adjacent.
struct AttnMatrix {
  const void* data = nullptr;
  DType dtype = float32;
  int64_t rows = 0, cols = 0, row_stride = 0;
};

// One query tile of one (batch, head). Packed operands come from the attn_pack_* functions below.
struct AttnTileArgs {
  AttnMath math = AttnMath::F32;
  // BF16 math on AMX tiles (TDPBF16PS) instead of VDPBF16PS: the AVX-512 variant only, where amx_usable().
  // The caller pads as kAttnAmxStep says; q then holds attn_round_up(rows, kAttnBlock) rows.
  bool amx = false;
  const void* q = nullptr;       // attn_pack_rows: [rows][d_pad]
  int64_t rows = 0;              // queries in this tile
  int64_t d_pad = 0;             // D rounded up to attn_pair(math)
  int64_t q_first = 0;           // sequence index of the tile's first query (for the causal mask)
  const void* k = nullptr;       // attn_pack_keys with skv_pad rows and d_pad columns
  const void* v = nullptr;       // attn_pack_values with skv_pad rows and dv_pad columns
  int64_t skv = 0, skv_pad = 0;  // keys; rounded up to kAttnBlock
  int64_t dv = 0, dv_pad = 0;    // value width; rounded up to kAttnBlock
  int64_t key_tile = 0;          // keys per online-softmax step, a multiple of kAttnBlock
  float scale = 1.0f;
  bool causal = false;
  // Optional bias at element (b, h, q_first, 0); column stride is 0 (one value per row) or 1.
  const void* bias = nullptr;
  DType bias_dtype = float32;
  int64_t bias_row_stride = 0, bias_col_stride = 0;
  // Output at element (b, h, q_first, 0), columns adjacent.
  void* out = nullptr;
  DType out_dtype = float32;
  int64_t out_row_stride = 0;
  float* scratch = nullptr;  // attn_scratch_floats(rows, key_tile, dv_pad) floats, 64-byte aligned
};

// Scores and probabilities [rows][key_tile] each (two of each with AMX, whose key tiles are pipelined), the
// output accumulator [rows][dv_pad], and per-row running max, running sum and rescale factor. With AMX the
// rows are rounded up to whole tiles.
inline int64_t attn_layout_rows(int64_t rows, bool amx) {
  return amx ? attn_round_up(rows, kAttnBlock) : rows;
}
inline size_t attn_scratch_floats(int64_t rows, int64_t key_tile, int64_t dv_pad, bool amx = false) {
  const int64_t r = attn_layout_rows(rows, amx);
  return static_cast<size_t>((amx ? 4 : 2) * r * key_tile + r * dv_pad + 3 * attn_round_up(rows, kAttnBlock));
}

// Q tile: [rows][cols_pad] in the math's element type, zero-padded columns.
KILN_ISA_DECLARE(void, attn_pack_rows, (const AttnMatrix& src, AttnMath math, void* dst, int64_t cols_pad));
// K of one head: [rows_pad / 16][cols_pad / pair][16 keys][pair], zero-padded.
KILN_ISA_DECLARE(void, attn_pack_keys,
                 (const AttnMatrix& src, AttnMath math, void* dst, int64_t rows_pad, int64_t cols_pad));
// V of one head: [cols_pad / 16][rows_pad / pair][16 columns][pair], zero-padded.
KILN_ISA_DECLARE(void, attn_pack_values,
                 (const AttnMatrix& src, AttnMath math, void* dst, int64_t rows_pad, int64_t cols_pad));
// The softmax's exponential, 2^x, on n floats (exposed for its accuracy test).
KILN_ISA_DECLARE(void, attn_softmax_exp2, (const float* x, float* y, int64_t n));
// Runs the online softmax over all keys for one query tile and writes its output rows.
KILN_ISA_DECLARE(void, attn_query_tile, (const AttnTileArgs& args));

}  // namespace kiln::cpu_kernels
