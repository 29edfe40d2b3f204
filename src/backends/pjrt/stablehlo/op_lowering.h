// Lowering Kiln's ops to StableHLO: one function per op name turns a runtime::OpCall into builder calls.
//
// Conventions (shared by strict eager's one-op modules, deferred-and-fused chains and compiled forwards, so a
// lowering never assumes it is alone in its module and never adds parameters or results itself):
//  - `inputs[i]` is the value of the view call.inputs[i] (its shape and dtype, whatever its strides; see
//    storage_views.h). An undefined call.inputs[i] (an absent optional input: layer_norm's weight or bias,
//    rms_norm's weight, group_norm's) is passed as an undefined Value (Value{}; defined() is false), so
//    positions never shift.
//  - The result has one value per call.outputs[i], with exactly that output's shape and dtype (lower_op
//  checks
//    this); writing it into the output's storage is the caller's job (store_view).
//  - The math follows the CPU kernels (src/backends/cpu/): 16-bit floats are widened to float32, computed and
//    rounded once; comparisons give bool; scalars come from the call's attrs.
// Not lowered (has_lowering false): linear_quantized and the collectives (all_reduce_sum, all_gather).
#pragma once

#include <string_view>
#include <vector>

#include "backends/pjrt/stablehlo/hlo_builder.h"
#include "runtime/op_call.h"

namespace kiln::pjrt::hlo {

bool has_lowering(std::string_view op);
// The names of every lowered op, sorted (for errors and docs).
std::vector<std::string_view> lowered_ops();

// Throws a kiln::Error naming the op when it has no lowering, when inputs.size() != call.inputs.size(), or
// when a lowering's result does not match call.outputs (a bug in the lowering).
std::vector<Value> lower_op(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& inputs);

}  // namespace kiln::pjrt::hlo
