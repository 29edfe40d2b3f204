#include "runtime/elementwise_op.h"

#include <iterator>

namespace kiln::runtime {

namespace {

struct Entry {
  EwOp op;
  std::string_view name;
};

// clang-format off
constexpr Entry kOps[] = {
    {EwOp::Add, "add"}, {EwOp::Sub, "sub"}, {EwOp::Mul, "mul"}, {EwOp::Div, "div"},
    {EwOp::Maximum, "maximum"}, {EwOp::Minimum, "minimum"}, {EwOp::Pow, "pow"},
    {EwOp::Eq, "eq"}, {EwOp::Ne, "ne"}, {EwOp::Lt, "lt"}, {EwOp::Le, "le"}, {EwOp::Gt, "gt"}, {EwOp::Ge, "ge"},
    {EwOp::Where, "where"},
    {EwOp::Neg, "neg"}, {EwOp::Abs, "abs"}, {EwOp::Exp, "exp"}, {EwOp::Log, "log"}, {EwOp::Sqrt, "sqrt"},
    {EwOp::Rsqrt, "rsqrt"}, {EwOp::Sin, "sin"}, {EwOp::Cos, "cos"}, {EwOp::Tanh, "tanh"},
    {EwOp::Sigmoid, "sigmoid"}, {EwOp::Silu, "silu"}, {EwOp::Gelu, "gelu"}, {EwOp::GeluTanh, "gelu_tanh"},
    {EwOp::QuickGelu, "quick_gelu"}, {EwOp::Square, "square"}, {EwOp::Clamp, "clamp"},
    {EwOp::PowScalar, "pow_scalar"},
};
// clang-format on

// ew_op_name indexes the table by the enum's value.
constexpr bool in_enum_order() {
  for (int i = 0; i < kEwOpCount; ++i)
    if (static_cast<int>(kOps[i].op) != i) return false;
  return true;
}
static_assert(std::size(kOps) == kEwOpCount && in_enum_order(), "one entry per EwOp, in the enum's order");

}  // namespace

std::string_view ew_op_name(EwOp op) {
  return kOps[static_cast<int>(op)].name;
}

std::optional<EwOp> find_ew_op(std::string_view name) {
  for (const Entry& e : kOps)
    if (e.name == name) return e.op;
  return std::nullopt;
}

}  // namespace kiln::runtime
