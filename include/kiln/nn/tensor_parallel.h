// How a layer is split over the ranks of a tensor-parallel group (Megatron-style, as diffusers' _tp_plan):
//  - Column: the weight's output features (rows) are split; each rank computes its slice of the output and
//    keeps it local (attention then runs on the rank's own heads). The bias is split with the rows.
//  - ColumnGathered: split like Column, then the slices are gathered, so every rank holds the full output
//    (for layers whose output everyone needs whole: modulation, embedders).
//  - Row: the weight's input features (columns) are split; each rank multiplies its slice of the input and
//    the partial products are summed over the ranks (one all-reduce, closing a Column -> Row pair). The
//    bias is added once, by rank 0, before the sum.
// A packed weight (FLUX's single-stream proj_out reads [attention | mlp]; FLUX.2's single-stream
// to_qkv_mlp_proj writes [q | k | v | gate | up]) names its blocks: each block is split on its own and the
// rank's pieces are concatenated, so the local layout matches the local inputs (or outputs).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::nn {

// This rank's place in a tensor-parallel group; size 1 means no parallelism.
struct TensorParallel {
  int64_t rank = 0;
  int64_t size = 1;

  bool enabled() const { return size > 1; }
  // n / size; throws kiln::Error naming `what` (e.g. "FluxAttention heads") when n is not divisible.
  int64_t split(int64_t n, const std::string& what) const;
};

enum class Sharding { Replicated, Column, ColumnGathered, Row };

struct LinearParallel {
  Sharding sharding = Sharding::Replicated;
  TensorParallel tp;
  // Sizes of the packed blocks along the split dimension (empty: one block, the whole dimension).
  std::vector<int64_t> blocks;
};

// The shardings a tensor-parallel plan writes, one per layer (inactive when tp.size is 1).
inline LinearParallel column(const TensorParallel& tp, std::vector<int64_t> blocks = {}) {
  return {Sharding::Column, tp, std::move(blocks)};
}
inline LinearParallel column_gathered(const TensorParallel& tp) {
  return {Sharding::ColumnGathered, tp, {}};
}
inline LinearParallel row(const TensorParallel& tp, std::vector<int64_t> blocks = {}) {
  return {Sharding::Row, tp, std::move(blocks)};
}

// Which slice of a parameter this rank holds: along `dim`, for each block [offset, offset + size) of the full
// tensor, the rank's equal part; concatenated in block order.
struct ParameterShard {
  int dim = 0;
  std::vector<int64_t> blocks;  // full sizes along dim, summing to the full extent
  TensorParallel tp;

  // The [start, end) ranges along `dim` this rank reads, in order.
  std::vector<std::pair<int64_t, int64_t>> ranges() const;
  // The local extent along `dim` (the sum of the ranges).
  int64_t local_extent() const;
};

}  // namespace kiln::nn
