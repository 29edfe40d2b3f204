// Elementwise op front ends: argument checks, broadcasting, torch's dtype promotion, output allocation and
// dispatch. Kernels: src/backends/cpu/elementwise.cpp.
#include "kiln/ops/elementwise.h"

#include <cmath>

#include "runtime/dispatcher.h"

namespace kiln {

namespace {

bool is_float_math(DType d) {
  return d == float32 || d == bfloat16 || d == float16;
}

// What the kernel receives for an operand: float32/bfloat16/float16/bool tensors are widened inside the
// float32-math kernels, so they travel as they are when the compute dtype is one of those floats; anything
// else is cast to the compute dtype first (the scalar kernels expect one dtype).
Tensor prepare(const Tensor& t, DType compute) {
  if (t.dtype() == compute) return t;
  if (is_float_math(compute) && (is_float_math(t.dtype()) || t.dtype() == boolean)) return t;
  return t.to(compute);
}

std::string operand_str(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape());
}

void check_defined(const char* op, const Tensor& t) {
  KILN_CHECK(t.defined(), op << ": expected a defined tensor, got an undefined one");
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.device() == b.device(), op << ": operands on " << a.device().str() << " and "
                                          << b.device().str()
                                          << "; move them to one device first (Tensor::to)");
}

enum class Kind {
  Arith,    // add, mul, maximum, minimum: bool works as logical or/and
  Numeric,  // sub, pow: bool is rejected, as in torch
  Div,      // always floating
  Compare,  // bool result
};

DType result_compute(const char* op, Kind kind, DType compute, const std::string& operands) {
  if (kind == Kind::Div && !is_floating(compute)) return float32;
  KILN_CHECK(!(kind == Kind::Numeric && compute == boolean),
             op << ": expected numeric tensors, got bool operands " << operands);
  return compute;
}

Tensor binary(const char* op, Kind kind, const Tensor& a, const Tensor& b) {
  check_defined(op, a);
  check_defined(op, b);
  check_same_device(op, a, b);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
  const DType compute = result_compute(op, kind, promote_types(a.dtype(), b.dtype()),
                                       operand_str(a) + " and " + operand_str(b));
  Tensor out = Tensor::empty(shape, kind == Kind::Compare ? boolean : compute, a.device());
  runtime::dispatch(runtime::OpCall{op, {prepare(a, compute), prepare(b, compute)}, {out}, {}});
  return out;
}

// The scalar's own dtype does not take part in promotion beyond "floating": a floating tensor keeps its
// dtype, an integer or bool tensor computes in float32. torch first rounds the scalar to the compute dtype
// for add, sub and comparisons, but multiplies and divides by the exact value (in float32 for 16-bit floats);
// `round_scalar` reproduces that.
Tensor binary_scalar(const char* op, Kind kind, const Tensor& x, double scalar, bool scalar_first,
                     bool round_scalar = false) {
  check_defined(op, x);
  const DType compute = is_floating(x.dtype()) ? x.dtype() : float32;
  if (round_scalar || kind == Kind::Compare) {
    scalar = visit_dtype(
        compute, [&](auto tag) { return scalar_to_double(scalar_from_double<decltype(tag)>(scalar)); });
  }
  Tensor out = Tensor::empty(x.shape(), kind == Kind::Compare ? boolean : compute, x.device());
  // A bool tensor computes in float32 here; cast it so that the kernel sees a float operand.
  const Tensor in = x.dtype() == boolean ? x.to(compute) : prepare(x, compute);
  runtime::dispatch(runtime::OpCall{
      op, {in}, {out}, runtime::Attrs().set("scalar", scalar).set("scalar_first", scalar_first)});
  return out;
}

enum class UnaryKind {
  Numeric,   // neg, abs, square: integers stay integers, bool is rejected
  Floating,  // exp, log, ...: integers and bool compute in float32
};

Tensor unary(const char* op, UnaryKind kind, const Tensor& x, runtime::Attrs attrs = {}) {
  check_defined(op, x);
  DType compute = x.dtype();
  if (kind == UnaryKind::Floating && !is_floating(compute)) compute = float32;
  KILN_CHECK(compute != boolean, op << ": expected a numeric tensor, got " << operand_str(x));
  Tensor out = Tensor::empty(x.shape(), compute, x.device());
  runtime::dispatch(runtime::OpCall{op, {prepare(x, compute)}, {out}, std::move(attrs)});
  return out;
}

}  // namespace

// ---- binary arithmetic
Tensor add(const Tensor& a, const Tensor& b) {
  return binary("add", Kind::Arith, a, b);
}
Tensor add(const Tensor& a, double b) {
  return binary_scalar("add", Kind::Arith, a, b, false, true);
}
Tensor add(double a, const Tensor& b) {
  return binary_scalar("add", Kind::Arith, b, a, true, true);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary("sub", Kind::Numeric, a, b);
}
Tensor sub(const Tensor& a, double b) {
  return binary_scalar("sub", Kind::Numeric, a, b, false, true);
}
Tensor sub(double a, const Tensor& b) {
  return binary_scalar("sub", Kind::Numeric, b, a, true, true);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary("mul", Kind::Arith, a, b);
}
Tensor mul(const Tensor& a, double b) {
  return binary_scalar("mul", Kind::Arith, a, b, false);
}
Tensor mul(double a, const Tensor& b) {
  return binary_scalar("mul", Kind::Arith, b, a, true);
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary("div", Kind::Div, a, b);
}
Tensor div(const Tensor& a, double b) {
  return binary_scalar("div", Kind::Div, a, b, false);
}
Tensor div(double a, const Tensor& b) {
  return binary_scalar("div", Kind::Div, b, a, true);
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return binary("maximum", Kind::Arith, a, b);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return binary("minimum", Kind::Arith, a, b);
}
Tensor pow(const Tensor& a, const Tensor& b) {
  return binary("pow", Kind::Numeric, a, b);
}

Tensor pow(const Tensor& a, double exponent) {
  check_defined("pow", a);
  const DType compute = is_floating(a.dtype()) ? a.dtype() : float32;
  // torch converts the exponent to the tensor's dtype first (x ** 1.7 on bfloat16 uses 1.703125).
  exponent = visit_dtype(
      compute, [&](auto tag) { return scalar_to_double(scalar_from_double<decltype(tag)>(exponent)); });
  Tensor out = Tensor::empty(a.shape(), compute, a.device());
  runtime::dispatch(runtime::OpCall{
      "pow_scalar", {prepare(a, compute)}, {out}, runtime::Attrs().set("exponent", exponent)});
  return out;
}

// ---- comparisons
Tensor eq(const Tensor& a, const Tensor& b) {
  return binary("eq", Kind::Compare, a, b);
}
Tensor ne(const Tensor& a, const Tensor& b) {
  return binary("ne", Kind::Compare, a, b);
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return binary("lt", Kind::Compare, a, b);
}
Tensor le(const Tensor& a, const Tensor& b) {
  return binary("le", Kind::Compare, a, b);
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return binary("gt", Kind::Compare, a, b);
}
Tensor ge(const Tensor& a, const Tensor& b) {
  return binary("ge", Kind::Compare, a, b);
}
Tensor eq(const Tensor& a, double b) {
  return binary_scalar("eq", Kind::Compare, a, b, false);
}
Tensor ne(const Tensor& a, double b) {
  return binary_scalar("ne", Kind::Compare, a, b, false);
}
Tensor lt(const Tensor& a, double b) {
  return binary_scalar("lt", Kind::Compare, a, b, false);
}
Tensor le(const Tensor& a, double b) {
  return binary_scalar("le", Kind::Compare, a, b, false);
}
Tensor gt(const Tensor& a, double b) {
  return binary_scalar("gt", Kind::Compare, a, b, false);
}
Tensor ge(const Tensor& a, double b) {
  return binary_scalar("ge", Kind::Compare, a, b, false);
}

// ---- unary
Tensor neg(const Tensor& x) {
  return unary("neg", UnaryKind::Numeric, x);
}
Tensor abs(const Tensor& x) {
  return unary("abs", UnaryKind::Numeric, x);
}
Tensor square(const Tensor& x) {
  return unary("square", UnaryKind::Numeric, x);
}
Tensor exp(const Tensor& x) {
  return unary("exp", UnaryKind::Floating, x);
}
Tensor log(const Tensor& x) {
  return unary("log", UnaryKind::Floating, x);
}
Tensor sqrt(const Tensor& x) {
  return unary("sqrt", UnaryKind::Floating, x);
}
Tensor rsqrt(const Tensor& x) {
  return unary("rsqrt", UnaryKind::Floating, x);
}
Tensor sin(const Tensor& x) {
  return unary("sin", UnaryKind::Floating, x);
}
Tensor cos(const Tensor& x) {
  return unary("cos", UnaryKind::Floating, x);
}
Tensor tanh(const Tensor& x) {
  return unary("tanh", UnaryKind::Floating, x);
}
Tensor sigmoid(const Tensor& x) {
  return unary("sigmoid", UnaryKind::Floating, x);
}
Tensor silu(const Tensor& x) {
  return unary("silu", UnaryKind::Floating, x);
}
Tensor quick_gelu(const Tensor& x) {
  return unary("quick_gelu", UnaryKind::Floating, x);
}
Tensor gelu(const Tensor& x, GeluApproximate approximate) {
  return unary(approximate == GeluApproximate::Tanh ? "gelu_tanh" : "gelu", UnaryKind::Floating, x);
}

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  check_defined("clamp", x);
  KILN_CHECK(min || max,
             "clamp: expected at least one of min and max, got neither (input " << operand_str(x) << ")");
  KILN_CHECK(x.dtype() != boolean, "clamp: expected a numeric tensor, got " << operand_str(x));
  KILN_CHECK(!(min && std::isnan(*min)) && !(max && std::isnan(*max)), "clamp: bounds must not be NaN");
  const bool whole = (!min || std::trunc(*min) == *min) && (!max || std::trunc(*max) == *max);
  const DType compute = is_floating(x.dtype()) || whole ? x.dtype() : float32;
  runtime::Attrs attrs;
  if (min) attrs.set("lo", *min);
  if (max) attrs.set("hi", *max);
  Tensor out = Tensor::empty(x.shape(), compute, x.device());
  runtime::dispatch(runtime::OpCall{"clamp", {prepare(x, compute)}, {out}, std::move(attrs)});
  return out;
}

// ---- where
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined("where", cond);
  check_defined("where", a);
  check_defined("where", b);
  check_same_device("where", cond, a);
  check_same_device("where", a, b);
  KILN_CHECK(cond.dtype() == boolean, "where: expected a bool condition, got " << operand_str(cond));
  const Shape shape =
      broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  const DType compute = promote_types(a.dtype(), b.dtype());
  Tensor out = Tensor::empty(shape, compute, a.device());
  runtime::dispatch(runtime::OpCall{"where", {cond, prepare(a, compute), prepare(b, compute)}, {out}, {}});
  return out;
}

// ---- operators
Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
Tensor operator+(const Tensor& a, double b) {
  return add(a, b);
}
Tensor operator+(double a, const Tensor& b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
Tensor operator-(const Tensor& a, double b) {
  return sub(a, b);
}
Tensor operator-(double a, const Tensor& b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
Tensor operator*(const Tensor& a, double b) {
  return mul(a, b);
}
Tensor operator*(double a, const Tensor& b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
Tensor operator/(const Tensor& a, double b) {
  return div(a, b);
}
Tensor operator/(double a, const Tensor& b) {
  return div(a, b);
}
Tensor operator-(const Tensor& x) {
  return neg(x);
}

}  // namespace kiln
