#include "backends/pjrt/stablehlo/op_lowering.h"

#include <algorithm>

#include "backends/pjrt/stablehlo/lowering_registry.h"
#include "kiln/core/error.h"

namespace kiln::pjrt::hlo {
namespace {

// Built once, sorted by name for lookup.
const LoweringTable& table() {
  static const LoweringTable sorted = [] {
    LoweringTable t;
    add_elementwise_lowerings(t);
    add_reduction_lowerings(t);
    add_layout_lowerings(t);
    add_linalg_lowerings(t);
    add_fused_lowerings(t);
    std::sort(t.begin(), t.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    return t;
  }();
  return sorted;
}

Lowering find(std::string_view op) {
  const LoweringTable& t = table();
  const auto it =
      std::lower_bound(t.begin(), t.end(), op, [](const auto& e, std::string_view k) { return e.first < k; });
  return it != t.end() && it->first == op ? it->second : nullptr;
}

}  // namespace

bool has_lowering(std::string_view op) {
  return find(op) != nullptr;
}

std::vector<std::string_view> lowered_ops() {
  std::vector<std::string_view> names;
  for (const auto& [name, fn] : table()) names.push_back(name);
  return names;
}

std::vector<Value> lower_op(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& inputs) {
  const Lowering lowering = find(call.op);
  KILN_CHECK(lowering != nullptr, "PJRT: op '" << call.op << "' has no StableHLO lowering ("
                                               << call.describe() << "); Kiln's PJRT backend cannot run it");
  KILN_CHECK(inputs.size() == call.inputs.size(), "lower_op " << call.op << ": " << inputs.size()
                                                              << " input values for " << call.inputs.size()
                                                              << " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = call.inputs[i];
    KILN_CHECK(inputs[i].defined() == t.defined() &&
                   (!t.defined() || (inputs[i].shape == t.shape() && inputs[i].dtype == t.dtype())),
               "lower_op " << call.op << ": input " << i << " value does not match the call's input ("
                           << call.describe() << ")");
  }
  std::vector<Value> results = lowering(b, call, inputs);
  KILN_CHECK(results.size() == call.outputs.size(), "lower_op " << call.op << ": internal: " << results.size()
                                                                << " results for " << call.outputs.size()
                                                                << " outputs");
  for (size_t i = 0; i < results.size(); ++i) {
    const Tensor& out = call.outputs[i];
    KILN_CHECK(results[i].shape == out.shape() && results[i].dtype == out.dtype(),
               "lower_op " << call.op << ": internal: result " << i << " is " << dtype_name(results[i].dtype)
                           << shape_str(results[i].shape) << ", the output is " << out.str());
  }
  return results;
}

}  // namespace kiln::pjrt::hlo
