#include "backends/pjrt/stablehlo/lowering_math.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "kiln/core/error.h"
#include "ops/activation_op.h"

namespace kiln::pjrt::hlo {
namespace {

Value limit_at_minus_inf(HloBuilder& b, const Value& x, const Value& r) {
  const Value at_minus_inf =
      b.compare(Compare::EQ, x, splat_like(b, -std::numeric_limits<double>::infinity(), x));
  return b.select(at_minus_inf, splat_like(b, -0.0, x), r);
}

}  // namespace

Value sigmoid(HloBuilder& b, const Value& x) {
  const Value one = splat_like(b, 1.0, x);
  return b.div(one, b.add(one, b.exp(b.neg(x))));
}

Value silu(HloBuilder& b, const Value& x) {
  return limit_at_minus_inf(b, x, b.div(x, b.add(splat_like(b, 1.0, x), b.exp(b.neg(x)))));
}

Value gelu(HloBuilder& b, const Value& x) {
  const Value erf = b.erf(b.mul(x, splat_like(b, 0.70710678118654752, x)));
  const Value half_x = b.mul(x, splat_like(b, 0.5, x));
  return limit_at_minus_inf(b, x, b.mul(half_x, b.add(splat_like(b, 1.0, x), erf)));
}

Value gelu_tanh(HloBuilder& b, const Value& x) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in torch's order of operations.
  const Value cube = b.mul(b.mul(x, x), x);
  const Value inner =
      b.mul(splat_like(b, 0.797884560802865355, x), b.add(x, b.mul(splat_like(b, 0.044715, x), cube)));
  const Value half_x = b.mul(splat_like(b, 0.5, x), x);
  return limit_at_minus_inf(b, x, b.mul(half_x, b.add(splat_like(b, 1.0, x), b.tanh(inner))));
}

Value quick_gelu(HloBuilder& b, const Value& x) {
  return limit_at_minus_inf(b, x, b.mul(x, sigmoid(b, b.mul(splat_like(b, 1.702, x), x))));
}

Value activation(HloBuilder& b, Activation act, const Value& x) {
  const std::optional<runtime::EwOp> op = ops::activation_op(act);
  if (!op) return x;
  switch (*op) {
    case runtime::EwOp::Gelu:
      return gelu(b, x);
    case runtime::EwOp::GeluTanh:
      return gelu_tanh(b, x);
    case runtime::EwOp::Silu:
      return silu(b, x);
    default:
      KILN_FAIL("activation: no lowering for " << runtime::ew_op_name(*op));
  }
}

Value mean_over(HloBuilder& b, const Value& x, const std::vector<int64_t>& dims) {
  int64_t count = 1;
  for (int64_t d : dims) count *= x.shape[static_cast<size_t>(d)];
  const Value sum = b.reduce(x, dims, ReduceKind::Sum);
  return b.div(sum, b.splat(static_cast<double>(count), x.dtype, sum.shape));
}

Value expand_reduced(HloBuilder& b, const Value& r, const Value& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) kept.push_back(d);
  return b.broadcast_in_dim(r, x.shape, kept);
}

}  // namespace kiln::pjrt::hlo
