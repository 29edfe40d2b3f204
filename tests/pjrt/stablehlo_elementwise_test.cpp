// Every elementwise op of the runtime's enum (runtime/elementwise_op.h) has a StableHLO lowering under its
// name: the lowerings are registered from the enum, and an op added to it without a case in
// lower_elementwise.cpp's switch fails here when the build does not already refuse it (-Wswitch without
// KILN_WERROR). Needs no plugin: only the module text is made.
#include <gtest/gtest.h>

#include <algorithm>

#include "backends/pjrt/stablehlo/op_lowering.h"
#include "backends/pjrt/stablehlo/op_module.h"
#include "runtime/elementwise_op.h"

namespace kiln::pjrt::hlo {
namespace {

using runtime::EwOp;

// A float32 call of `op` as its front end makes one: where's condition is bool, comparisons give bool, and
// clamp and pow_scalar carry their attributes.
runtime::OpCall float_call(EwOp op) {
  runtime::OpCall call{runtime::ew_op_name(op), {}, {}, {}};
  if (op == EwOp::Where) call.inputs.push_back(Tensor::zeros({2, 3}, boolean));
  for (int i = op == EwOp::Where ? 1 : 0; i < runtime::ew_arity(op); ++i)
    call.inputs.push_back(Tensor::zeros({2, 3}, float32));
  call.outputs.push_back(Tensor::zeros({2, 3}, runtime::ew_is_comparison(op) ? boolean : float32));
  if (op == EwOp::Clamp) call.attrs.set("lo", -1.0).set("hi", 1.0);
  if (op == EwOp::PowScalar) call.attrs.set("exponent", 1.7);
  return call;
}

TEST(StableHloElementwise, EveryEwOpIsLoweredUnderItsName) {
  const std::vector<std::string_view> lowered = lowered_ops();
  for (int i = 0; i < runtime::kEwOpCount; ++i) {
    const EwOp op = static_cast<EwOp>(i);
    const std::string_view name = runtime::ew_op_name(op);
    EXPECT_TRUE(has_lowering(name)) << name;
    EXPECT_TRUE(std::binary_search(lowered.begin(), lowered.end(), name)) << name;
    const runtime::OpCall call = float_call(op);
    EXPECT_NO_THROW(op_module(call)) << call.describe();
  }
}

}  // namespace
}  // namespace kiln::pjrt::hlo
