#include "backends/pjrt/stablehlo/op_module.h"

#include "backends/pjrt/stablehlo/op_lowering.h"
#include "backends/pjrt/stablehlo/storage_views.h"
#include "kiln/core/error.h"

namespace kiln::pjrt::hlo {

OpModule op_module(const runtime::OpCall& call, const LoweringTarget& target, const ArrayDims& array_dims) {
  KILN_CHECK(has_lowering(call.op), "PJRT: op '" << call.op << "' has no StableHLO lowering ("
                                                 << call.describe()
                                                 << "); Kiln's PJRT backend cannot run it");
  HloBuilder b("kiln_" + std::string(call.op), target);
  b.lift_scalars();
  OpModule m;
  std::vector<Value> inputs;
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    const Tensor& t = call.inputs[i];
    if (!t.defined()) {
      inputs.emplace_back();
      continue;
    }
    const Shape dims = array_dims(t);
    m.params.push_back({OpModule::Source::Input, static_cast<int64_t>(i), t.dtype(), dims});
    inputs.push_back(load_view(b, b.parameter(t.dtype(), dims), layout_of(t)));
  }
  // The storages the outputs update, before the lowering so the parameters come first in the text.
  std::vector<Value> before(call.outputs.size());
  for (size_t i = 0; i < call.outputs.size(); ++i) {
    const Tensor& out = call.outputs[i];
    const ViewLayout layout = layout_of(out);
    if (covers_whole_storage(layout, storage_elements(out))) {
      m.results.push_back({out.dtype(), whole_storage_dims(layout)});
      continue;
    }
    const Shape dims = array_dims(out);
    m.results.push_back({out.dtype(), dims});
    m.params.push_back({OpModule::Source::OutputBefore, static_cast<int64_t>(i), out.dtype(), dims});
    before[i] = b.parameter(out.dtype(), dims);
  }
  const std::vector<Value> values = lower_op(b, call, inputs);
  // The lowering made the scalar parameters after every storage parameter, in order.
  for (const HloBuilder::LiftedScalar& s : b.lifted_scalars()) {
    KILN_CHECK(s.parameter == static_cast<int64_t>(m.params.size()),
               "internal: " << call.op << "'s scalar is parameter " << s.parameter << ", expected "
                            << m.params.size());
    m.params.push_back({OpModule::Source::Scalar, -1, s.dtype, {}, s.value});
  }
  std::vector<Value> results;
  for (size_t i = 0; i < values.size(); ++i) {
    const Tensor& out = call.outputs[i];
    const ViewLayout layout = layout_of(out);
    if (!before[i].defined()) {
      results.push_back(store_whole(b, values[i], layout));
    } else {
      results.push_back(store_view(b, before[i], values[i], layout));
    }
  }
  m.text = b.module_text(results);
  return m;
}

}  // namespace kiln::pjrt::hlo
