#include "graph/fusion_rules.h"

#include <string_view>

#include "kiln/core/error.h"

namespace kiln::graph {

namespace {

struct Rule {
  std::string_view op;
  FusedOp fused;
};

// Unary ops: the output has the input's dtype.
constexpr Rule kUnary[] = {
    {"neg", FusedOp::Neg},
    {"abs", FusedOp::Abs},
    {"exp", FusedOp::Exp},
    {"log", FusedOp::Log},
    {"sqrt", FusedOp::Sqrt},
    {"rsqrt", FusedOp::Rsqrt},
    {"tanh", FusedOp::Tanh},
    {"sigmoid", FusedOp::Sigmoid},
    {"silu", FusedOp::Silu},
    {"gelu", FusedOp::Gelu},
    {"gelu_tanh", FusedOp::GeluTanh},
    {"quick_gelu", FusedOp::QuickGelu},
    {"square", FusedOp::Square},
};

// Binary ops with two tensors, or one tensor and a "scalar" attribute.
constexpr Rule kBinary[] = {
    {"add", FusedOp::Add}, {"sub", FusedOp::Sub},         {"mul", FusedOp::Mul},
    {"div", FusedOp::Div}, {"maximum", FusedOp::Maximum}, {"minimum", FusedOp::Minimum},
};

const Rule* find(const Rule* begin, const Rule* end, std::string_view op) {
  for (const Rule* r = begin; r != end; ++r)
    if (r->op == op) return r;
  return nullptr;
}
const Rule* find_unary(std::string_view op) {
  return find(std::begin(kUnary), std::end(kUnary), op);
}
const Rule* find_binary(std::string_view op) {
  return find(std::begin(kBinary), std::end(kBinary), op);
}

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
  if (find_unary(call.op)) return n == 1 && call.inputs[0].dtype() == out.dtype();
  if (find_binary(call.op)) return n == 2 || (n == 1 && call.attrs.has("scalar"));
  if (call.op == "clamp") return n == 1;
  if (call.op == "copy") return n == 1 && call.inputs[0].shape() == out.shape();
  return false;
}

ValueId add_to_region(ElementwiseRegion& region, const runtime::OpCall& call,
                      const std::vector<ValueId>& args, std::vector<double>& scalars) {
  KILN_CHECK(args.size() == call.inputs.size(), "internal: " << call.op << " fused with " << args.size()
                                                             << " operands for " << call.inputs.size());
  const DType dt = call.outputs[0].dtype();
  if (const Rule* r = find_unary(call.op)) return region.unary(r->fused, args[0], dt);
  if (const Rule* r = find_binary(call.op)) {
    if (args.size() == 2) return region.binary(r->fused, args[0], args[1], dt);
    // The front end already rounded the scalar where torch does (add/sub on 16-bit floats), and the unfused
    // kernel then uses it as a float32; so does the fused one.
    scalars.push_back(call.attrs.get_float("scalar"));
    const ValueId s = region.scalar(float32);
    return call.attrs.get_bool("scalar_first") ? region.binary(r->fused, s, args[0], dt)
                                               : region.binary(r->fused, args[0], s, dt);
  }
  if (call.op == "clamp") {
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
  if (call.op == "copy") return region.cast(args[0], dt);
  KILN_FAIL("internal: op " << call.op << " has no fused form");
}

}  // namespace kiln::graph
