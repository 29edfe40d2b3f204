// Lowerings of the elementwise ops (src/backends/cpu/elementwise.cpp), one per runtime::EwOp chosen by a
// switch on the enum as the CPU kernels are, and of "copy" (dtype conversion).
//
// Like the CPU kernels: when the output or any tensor operand is float32 / bfloat16 / float16 (bool operands
// widen to 0 / 1), every operand is converted to float32, the op computed in float32 (a scalar attr as a
// float32 constant) and the result rounded once to the output dtype; otherwise (integers, bool, float64) the
// op computes in the operands' own dtype (integers wrap; bool add / mul are or / and).
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "backends/pjrt/stablehlo/lowering_math.h"
#include "backends/pjrt/stablehlo/lowering_registry.h"
#include "kiln/core/error.h"
#include "runtime/elementwise_op.h"

namespace kiln::pjrt::hlo {
namespace {

using runtime::EwOp;

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

// x ** e in the compute dtype, with the shortcuts torch (and the CPU kernel) take for some exponents, which
// round differently from pow.
Value pow_scalar(HloBuilder& b, const Value& x, double e) {
  const Value one = splat_like(b, 1.0, x);
  if (e == 2.0) return b.mul(x, x);
  if (e == 3.0) return b.mul(b.mul(x, x), x);
  if (e == 0.5) return b.sqrt(x);
  if (e == -0.5) return b.div(one, b.sqrt(x));
  if (e == -1.0) return b.div(one, x);
  if (e == -2.0) return b.div(one, b.mul(x, x));
  return b.pow(x, splat_like(b, static_cast<float>(e), x));
}

// Written so that NaN stays NaN: x < lo ? lo : x, then r > hi ? hi : r. Integer bounds are clamped to the
// dtype's range first (an int8 tensor clamped to [-1000, 1000] is unchanged).
Value clamp(HloBuilder& b, const Value& x, const runtime::Attrs& attrs) {
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

// `op` on its prepared operands: in the compute dtype, except a comparison's bool. where's condition is the
// call's first input, broadcast here (after its operands, as the module text has always had it). One case
// per EwOp and no default, so an op added to the enum without a lowering here is a -Wswitch error (under
// KILN_WERROR) and otherwise the internal error below, which stablehlo_elementwise_test trips for every op.
Value ew_math(HloBuilder& b, EwOp op, const runtime::OpCall& call, const std::vector<Value>& inputs,
              const Operands& ops) {
  const std::vector<Value>& v = ops.xs;
  // Bool operands (not float math) add and take the maximum as or, multiply and take the minimum as and.
  const bool logical = v[0].dtype == DType::Bool;
  switch (op) {
    case EwOp::Add:
      return logical ? b.logical_or(v[0], v[1]) : b.binary("add", v[0], v[1]);
    case EwOp::Sub:
      return b.binary("subtract", v[0], v[1]);
    case EwOp::Mul:
      return logical ? b.logical_and(v[0], v[1]) : b.binary("multiply", v[0], v[1]);
    case EwOp::Div:
      return b.binary("divide", v[0], v[1]);
    case EwOp::Maximum:
      return logical ? b.logical_or(v[0], v[1]) : b.binary("maximum", v[0], v[1]);
    case EwOp::Minimum:
      return logical ? b.logical_and(v[0], v[1]) : b.binary("minimum", v[0], v[1]);
    case EwOp::Pow:
      return b.binary("power", v[0], v[1]);
    case EwOp::Eq:
      return b.compare(Compare::EQ, v[0], v[1]);
    case EwOp::Ne:
      return b.compare(Compare::NE, v[0], v[1]);
    case EwOp::Lt:
      return b.compare(Compare::LT, v[0], v[1]);
    case EwOp::Le:
      return b.compare(Compare::LE, v[0], v[1]);
    case EwOp::Gt:
      return b.compare(Compare::GT, v[0], v[1]);
    case EwOp::Ge:
      return b.compare(Compare::GE, v[0], v[1]);
    case EwOp::Where:
      return b.select(b.broadcast_to(inputs[0], call.outputs[0].shape()), v[0], v[1]);
    case EwOp::Neg:
      return b.neg(v[0]);
    case EwOp::Abs:
      return b.abs(v[0]);
    case EwOp::Exp:
      return b.exp(v[0]);
    case EwOp::Log:
      return b.log(v[0]);
    case EwOp::Sqrt:
      return b.sqrt(v[0]);
    case EwOp::Rsqrt:
      return b.div(splat_like(b, 1.0, v[0]), b.sqrt(v[0]));  // the kernel's 1 / sqrt(x)
    case EwOp::Sin:
      return b.sin(v[0]);
    case EwOp::Cos:
      return b.cos(v[0]);
    case EwOp::Tanh:
      return b.tanh(v[0]);
    case EwOp::Sigmoid:
      return sigmoid(b, v[0]);
    case EwOp::Silu:
      return silu(b, v[0]);
    case EwOp::Gelu:
      return gelu(b, v[0]);
    case EwOp::GeluTanh:
      return gelu_tanh(b, v[0]);
    case EwOp::QuickGelu:
      return quick_gelu(b, v[0]);
    case EwOp::Square:
      return b.mul(v[0], v[0]);
    case EwOp::Clamp:
      return clamp(b, v[0], call.attrs);
    case EwOp::PowScalar:
      return pow_scalar(b, v[0], call.attrs.get_float("exponent"));
  }
  KILN_FAIL("internal: elementwise op '" << runtime::ew_op_name(op) << "' has no StableHLO lowering ("
                                         << call.describe() << ")");
}

// The lowering of one EwOp, registered under the op's name; where's condition is not an operand of the math.
template <EwOp kOp>
std::vector<Value> lower_ew(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& inputs) {
  const Operands ops = prepare(b, call, inputs, kOp == EwOp::Where ? 1 : 0);
  const Value r = ew_math(b, kOp, call, inputs, ops);
  // A comparison's bool is the output as it is.
  if constexpr (runtime::ew_is_comparison(kOp))
    return {r};
  else
    return {finish(b, call, r)};
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

}  // namespace

// One lowering per EwOp, under the enum's own names (runtime/elementwise_op.h), so no list of names here can
// drift from it; and copy.
void add_elementwise_lowerings(LoweringTable& t) {
  t.push_back({"copy", lower_copy});
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (t.push_back({runtime::ew_op_name(static_cast<EwOp>(I)), lower_ew<static_cast<EwOp>(I)>}), ...);
  }
  (std::make_integer_sequence<int, runtime::kEwOpCount>{});
}

}  // namespace kiln::pjrt::hlo
