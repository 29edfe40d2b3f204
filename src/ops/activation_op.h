// The public kiln::Activation (kiln/ops/fused.h) mapped onto the runtime's elementwise ops, here and nowhere
// else: a fused linear's activation is the elementwise op of the same name, so the graph's patterns find it
// by that op and a backend lowers it as that op. linear_fused carries it as its "act" attribute (the
// Activation's value).
#pragma once

#include <cstdint>
#include <optional>

#include "kiln/core/error.h"
#include "kiln/ops/fused.h"
#include "runtime/elementwise_op.h"

namespace kiln::ops {

struct ActivationOp {
  Activation act;
  runtime::EwOp op;
};
inline constexpr ActivationOp kActivationOps[] = {
    {Activation::Gelu, runtime::EwOp::Gelu},
    {Activation::GeluTanh, runtime::EwOp::GeluTanh},
    {Activation::Silu, runtime::EwOp::Silu},
};

// The elementwise op `act` applies; nothing for Activation::None.
constexpr std::optional<runtime::EwOp> activation_op(Activation act) {
  for (const ActivationOp& a : kActivationOps)
    if (a.act == act) return a.op;
  return std::nullopt;
}

// The Activation that applies `op`, or nothing when none does (a linear_fused cannot take that op).
constexpr std::optional<Activation> activation_of(runtime::EwOp op) {
  for (const ActivationOp& a : kActivationOps)
    if (a.op == op) return a.act;
  return std::nullopt;
}

// linear_fused's "act" attribute as an Activation; throws kiln::Error for a value that names none.
inline Activation activation_from_attr(int64_t value) {
  KILN_CHECK(
      value >= static_cast<int64_t>(Activation::None) && value <= static_cast<int64_t>(Activation::Silu),
      "linear_fused: unknown activation " << value << " (expected None, Gelu, GeluTanh or Silu)");
  return static_cast<Activation>(value);
}

}  // namespace kiln::ops
