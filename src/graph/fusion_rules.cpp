#include "graph/fusion_rules.h"

#include <optional>
#include <string_view>

#include "kiln/core/error.h"

namespace kiln::graph {

namespace {

bool is_float(DType d) {
  return d == float32 || d == bfloat16 || d == float16;
}

}  // namespace

bool is_fusable(const runtime::OpCall& call) {
  if (call.outputs.size() != 1) return false;
  const Tensor& out = call.outputs[0];
  if (!out.defined() || !is_float(out.dtype()) || !out.is_contiguous() || out.numel() == 0) return false;
  if (out.device().type != DeviceType::CPU) return false;
  for (const Tensor& t : call.inputs)
    if (!t.defined() || !is_float(t.dtype()) || t.device() != out.device()) return false;
  const size_t n = call.inputs.size();
  if (call.op == "copy") return n == 1 && call.inputs[0].shape() == out.shape();
  const std::optional<EwOp> op = runtime::find_ew_op(call.op);
  if (!op) return false;
  if (fusable_unary(*op)) return n == 1 && call.inputs[0].dtype() == out.dtype();
  if (fusable_binary(*op)) return n == 2 || (n == 1 && call.attrs.has("scalar"));
  if (*op == EwOp::Clamp) return n == 1;
  return false;
}

ValueId add_to_region(ElementwiseRegion& region, const runtime::OpCall& call,
                      const std::vector<ValueId>& args, std::vector<double>& scalars) {
  KILN_CHECK(args.size() == call.inputs.size(), "internal: " << call.op << " fused with " << args.size()
                                                             << " operands for " << call.inputs.size());
  const DType dt = call.outputs[0].dtype();
  if (call.op == "copy") return region.cast(args[0], dt);
  const std::optional<EwOp> op = runtime::find_ew_op(call.op);
  KILN_CHECK(op.has_value(), "internal: op " << call.op << " has no fused form");
  if (fusable_unary(*op)) return region.unary(*op, args[0], dt);
  if (fusable_binary(*op)) {
    if (args.size() == 2) return region.binary(*op, args[0], args[1], dt);
    // The front end already rounded the scalar where torch does (add/sub on 16-bit floats), and the unfused
    // kernel then uses it as a float32; so does the fused one.
    scalars.push_back(call.attrs.get_float("scalar"));
    const ValueId s = region.scalar(float32);
    return call.attrs.get_bool("scalar_first") ? region.binary(*op, s, args[0], dt)
                                               : region.binary(*op, args[0], s, dt);
  }
  if (*op == EwOp::Clamp) {
    ValueId lo = -1, hi = -1;
    if (call.attrs.has("lo")) {
      scalars.push_back(call.attrs.get_float("lo"));
      lo = region.scalar(float32);
    }
    if (call.attrs.has("hi")) {
      scalars.push_back(call.attrs.get_float("hi"));
      hi = region.scalar(float32);
    }
    return region.clamp(args[0], lo, hi, dt);
  }
  KILN_FAIL("internal: op " << call.op << " has no fused form");
}

}  // namespace kiln::graph
