// Lowerings of the elementwise ops (src/backends/cpu/elementwise.cpp) and of "copy" (dtype conversion).
//
// Like the CPU kernels: when the output or any tensor operand is float32 / bfloat16 / float16 (bool operands
// widen to 0 / 1), every operand is converted to float32, the op computed in float32 (a scalar attr as a
// float32 constant) and the result rounded once to the output dtype; otherwise (integers, bool, float64) the
// op computes in the operands' own dtype (integers wrap; bool add / mul are or / and).
#include <cmath>
#include <limits>
#include <string>

#include "backends/pjrt/stablehlo/lowering_math.h"
#include "backends/pjrt/stablehlo/lowering_registry.h"
#include "kiln/core/error.h"

namespace kiln::pjrt::hlo {
namespace {

struct Operands {
  std::vector<Value> xs;  // the tensor operands (and the scalar, in its place), broadcast to the output
  DType compute;
  bool float_math;
};

// The operands as the kernel sees them: `skip` leading inputs (where's condition) are left out.
Operands prepare(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& inputs, size_t skip) {
  const Tensor& out = call.outputs[0];
  Operands ops;
  ops.float_math = is_float_math(out.dtype());
  for (size_t i = skip; i < inputs.size(); ++i)
    ops.float_math = ops.float_math || is_float_math(inputs[i].dtype);
  ops.compute = ops.float_math ? DType::Float32 : inputs[skip].dtype;
  for (size_t i = skip; i < inputs.size(); ++i)
    ops.xs.push_back(b.broadcast_to(b.convert(inputs[i], ops.compute), out.shape()));
  if (call.attrs.has("scalar")) {
    // The float kernels take the scalar as a float; the others as the operand's type.
    const double s = call.attrs.get_float("scalar");
    const double v = ops.float_math ? static_cast<double>(static_cast<float>(s)) : s;
    const Value scalar =
        b.scalar_operand(ops.compute == DType::Bool ? (v != 0) : v, ops.compute, out.shape());
    if (call.attrs.get_bool("scalar_first"))
      ops.xs.insert(ops.xs.begin(), scalar);
    else
      ops.xs.push_back(scalar);
  }
  return ops;
}

Value finish(HloBuilder& b, const runtime::OpCall& call, const Value& r) {
  return b.convert(r, call.outputs[0].dtype());
}

Value binary_math(HloBuilder& b, std::string_view op, const Value& x, const Value& y) {
  if (x.dtype == DType::Bool) {
    if (op == "add" || op == "maximum") return b.logical_or(x, y);
    if (op == "multiply" || op == "minimum") return b.logical_and(x, y);
  }
  return b.binary(op, x, y);
}

template <const char* kOp>
std::vector<Value> lower_binary(HloBuilder& b, const runtime::OpCall& call,
                                const std::vector<Value>& inputs) {
  const Operands ops = prepare(b, call, inputs, 0);
  return {finish(b, call, binary_math(b, kOp, ops.xs[0], ops.xs[1]))};
}

template <Compare kCmp>
std::vector<Value> lower_compare(HloBuilder& b, const runtime::OpCall& call,
                                 const std::vector<Value>& inputs) {
  const Operands ops = prepare(b, call, inputs, 0);
  return {b.compare(kCmp, ops.xs[0], ops.xs[1])};
}

std::vector<Value> lower_where(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& inputs) {
  const Operands ops = prepare(b, call, inputs, 1);
  const Value cond = b.broadcast_to(inputs[0], call.outputs[0].shape());
  return {finish(b, call, b.select(cond, ops.xs[0], ops.xs[1]))};
}

// The unary ops, by name, on a value of the compute dtype.
Value unary_math(HloBuilder& b, std::string_view op, const Value& x, const runtime::Attrs& attrs) {
  if (op == "neg") return b.neg(x);
  if (op == "abs") return b.abs(x);
  if (op == "square") return b.mul(x, x);
  if (op == "exp") return b.exp(x);
  if (op == "log") return b.log(x);
  if (op == "sqrt") return b.sqrt(x);
  if (op == "rsqrt") return b.div(splat_like(b, 1.0, x), b.sqrt(x));  // the kernel's 1 / sqrt(x)
  if (op == "sin") return b.sin(x);
  if (op == "cos") return b.cos(x);
  if (op == "tanh") return b.tanh(x);
  if (op == "sigmoid") return sigmoid(b, x);
  if (op == "silu") return silu(b, x);
  if (op == "gelu") return gelu(b, x);
  if (op == "gelu_tanh") return gelu_tanh(b, x);
  if (op == "quick_gelu") return quick_gelu(b, x);
  if (op == "pow_scalar") {
    const double e = attrs.get_float("exponent");
    // The shortcuts torch (and the CPU kernel) take, which round differently from pow.
    const Value one = splat_like(b, 1.0, x);
    if (e == 2.0) return b.mul(x, x);
    if (e == 3.0) return b.mul(b.mul(x, x), x);
    if (e == 0.5) return b.sqrt(x);
    if (e == -0.5) return b.div(one, b.sqrt(x));
    if (e == -1.0) return b.div(one, x);
    if (e == -2.0) return b.div(one, b.mul(x, x));
    return b.pow(x, splat_like(b, static_cast<float>(e), x));
  }
  if (op == "clamp") {
    // Written so that NaN stays NaN: x < lo ? lo : x, then r > hi ? hi : r. Integer bounds are clamped to the
    // dtype's range first (an int8 tensor clamped to [-1000, 1000] is unchanged).
    Value r = x;
    auto bound = [&](const char* name) {
      double v = attrs.get_float(name);
      if (!is_floating(x.dtype))
        visit_dtype(x.dtype, [&](auto t) {
          using T = decltype(t);
          if constexpr (std::is_integral_v<T>)
            v = std::fmin(std::fmax(v, static_cast<double>(std::numeric_limits<T>::lowest())),
                          static_cast<double>(std::numeric_limits<T>::max()));
        });
      return splat_like(b, v, x);
    };
    if (attrs.has("lo")) {
      const Value lo = bound("lo");
      r = b.select(b.compare(Compare::LT, r, lo), lo, r);
    }
    if (attrs.has("hi")) {
      const Value hi = bound("hi");
      r = b.select(b.compare(Compare::GT, r, hi), hi, r);
    }
    return r;
  }
  KILN_FAIL("internal: no unary lowering for '" << op << "'");
}

std::vector<Value> lower_unary(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& inputs) {
  const Operands ops = prepare(b, call, inputs, 0);
  return {finish(b, call, unary_math(b, call.op, ops.xs[0], call.attrs))};
}

// "copy": the input (already broadcast to the output's shape by the front end) converted to the output dtype.
// float32 -> 16-bit floats round to nearest even like the CPU's casts; float -> int truncates toward zero.
std::vector<Value> lower_copy(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& inputs) {
  const DType to = call.outputs[0].dtype();
  Value x = b.broadcast_to(inputs[0], call.outputs[0].shape());
  // 16-bit float <-> anything but float32 goes through float32, as the CPU kernel does.
  const bool half = [](DType d) { return d == DType::BFloat16 || d == DType::Float16; }(to);
  if (half && x.dtype != DType::Float32 && x.dtype != to) x = b.convert(x, DType::Float32);
  return {b.convert(x, to)};
}

constexpr char kAdd[] = "add", kSub[] = "subtract", kMul[] = "multiply", kDiv[] = "divide",
               kMax[] = "maximum", kMin[] = "minimum", kPow[] = "power";

}  // namespace

void add_elementwise_lowerings(LoweringTable& t) {
  t.push_back({"copy", lower_copy});
  t.push_back({"add", lower_binary<kAdd>});
  t.push_back({"sub", lower_binary<kSub>});
  t.push_back({"mul", lower_binary<kMul>});
  t.push_back({"div", lower_binary<kDiv>});
  t.push_back({"maximum", lower_binary<kMax>});
  t.push_back({"minimum", lower_binary<kMin>});
  t.push_back({"pow", lower_binary<kPow>});
  t.push_back({"eq", lower_compare<Compare::EQ>});
  t.push_back({"ne", lower_compare<Compare::NE>});
  t.push_back({"lt", lower_compare<Compare::LT>});
  t.push_back({"le", lower_compare<Compare::LE>});
  t.push_back({"gt", lower_compare<Compare::GT>});
  t.push_back({"ge", lower_compare<Compare::GE>});
  t.push_back({"where", lower_where});
  for (std::string_view op : {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
                              "silu", "gelu", "gelu_tanh", "quick_gelu", "square", "clamp", "pow_scalar"})
    t.push_back({op, lower_unary});
}

}  // namespace kiln::pjrt::hlo
