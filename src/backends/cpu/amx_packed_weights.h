// A weight's copy in the AMX GEMM's tile layout (gemm_amx.h), made once and kept on the weight's Storage as
// oneDNN's packed copies are (both through packed_weight_copies.h): the products that would otherwise pack
// the weight's tiles on every call (a pass over the whole weight per call and per row block) read it instead.
#pragma once

#include <cstdint>

#include "kiln/core/tensor.h"

namespace kiln::cpu_kernels {

// The whole of bf16 `weight` [N, K] (any strides; K a multiple of 32) in the tile layout, as
// avx512::amx_pack_weights makes it for all N columns and all of K: round_up(N, 16) / 16 groups of K / 2 rows
// of 16 pairs. Made on first use, keyed by the view (offset, shape, strides); nullptr when a new copy would
// exceed the packed-weight budget (kiln::set_packed_weight_budget): the caller then packs per call.
const uint16_t* amx_packed_weight(const Tensor& weight);

}  // namespace kiln::cpu_kernels
