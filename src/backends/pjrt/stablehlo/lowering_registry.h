// The table op_lowering.cpp dispatches on: each op family's file registers its lowerings here.
#pragma once

#include <string_view>
#include <utility>
#include <vector>

#include "backends/pjrt/stablehlo/hlo_builder.h"
#include "runtime/op_call.h"

namespace kiln::pjrt::hlo {

using Lowering = std::vector<Value> (*)(HloBuilder&, const runtime::OpCall&, const std::vector<Value>&);
using LoweringTable = std::vector<std::pair<std::string_view, Lowering>>;

void add_elementwise_lowerings(LoweringTable& table);  // lower_elementwise.cpp: every runtime::EwOp, copy
void add_reduction_lowerings(LoweringTable& table);    // lower_reduction.cpp: reductions, softmax, norms
void add_layout_lowerings(LoweringTable& table);       // lower_layout.cpp: concat, embedding, upsample, rope
void add_linalg_lowerings(LoweringTable& table);       // lower_linalg.cpp: matmul, linear, conv2d
void add_fused_lowerings(LoweringTable& table);        // lower_fused.cpp: attention, linear_fused

}  // namespace kiln::pjrt::hlo
