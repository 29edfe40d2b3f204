// Every elementwise op, named once. The CPU kernels (backends/cpu/elementwise.cpp) and the fused regions of
// the graph (graph/elementwise_region.h) switch on this enum, the op table (op_table.cpp) takes these ops'
// names from it, and the public kiln::Activation maps onto it in one place (ops/activation_op.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln::runtime {

enum class EwOp : uint8_t {
  // binary (two operands)
  Add,
  Sub,
  Mul,
  Div,
  Maximum,
  Minimum,
  Pow,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  // ternary: where(cond, a, b)
  Where,
  // unary
  Neg,
  Abs,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Sin,
  Cos,
  Tanh,
  Sigmoid,
  Silu,
  Gelu,
  GeluTanh,
  QuickGelu,
  Square,
  Clamp,  // bounds as attributes ("lo", "hi"), or as operands inside a fused region
  PowScalar,
};
inline constexpr int kEwOpCount = static_cast<int>(EwOp::PowScalar) + 1;

// Tensor operands of the op as called (clamp's bounds and a binary op's "scalar" attribute aside).
constexpr int ew_arity(EwOp op) {
  if (op == EwOp::Where) return 3;
  return op < EwOp::Where ? 2 : 1;
}
constexpr bool ew_is_comparison(EwOp op) {
  return op >= EwOp::Eq && op <= EwOp::Ge;
}

// The op's name in the op table: "add", "gelu_tanh".
std::string_view ew_op_name(EwOp op);
// The elementwise op named `name`, or nothing (not an elementwise op).
std::optional<EwOp> find_ew_op(std::string_view name);

}  // namespace kiln::runtime
