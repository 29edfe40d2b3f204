// Lowerings of scaled_dot_product_attention (src/backends/cpu/attention.cpp) and linear_fused
// (src/backends/cpu/fused_linear.cpp, linear_epilogue.h) as plain ops: XLA fuses them as it sees fit. A fused
// cuDNN attention call for NVIDIA GPUs is a separate lowering (issue #25, step 6).
#include <limits>

#include "backends/pjrt/stablehlo/lower_products.h"
#include "backends/pjrt/stablehlo/lowering_math.h"
#include "backends/pjrt/stablehlo/lowering_registry.h"
#include "kiln/core/error.h"
#include "ops/activation_op.h"

namespace kiln::pjrt::hlo {
namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// q [B, H, Sq, D], k [B, H, Skv, D], v [B, H, Skv, Dv], optional bias broadcast to [B, H, Sq, Skv] (float:
// added; bool: true attends, false masks); attrs scale, is_causal (query i sees keys j <= i). Scores, softmax
// and the product with v in float32 (16-bit operands are exact in float32). A row whose every key is masked
// is NaN, as in torch.
std::vector<Value> lower_attention(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& in) {
  const Value q = to_f32(b, in[0]), k = to_f32(b, in[1]), v = to_f32(b, in[2]);
  Value s = b.dot_general(q, k, DotDims{{0, 1}, {0, 1}, {3}, {3}}, DType::Float32);
  s = b.mul(s, b.splat(static_cast<float>(call.attrs.get_float("scale")), DType::Float32, s.shape));
  if (in.size() > 3) {
    const Value bias = b.broadcast_to(in[3], s.shape);
    if (bias.dtype == DType::Bool)
      s = b.select(bias, s, b.splat(kMinusInf, DType::Float32, s.shape));
    else
      s = b.add(s, to_f32(b, bias));
  }
  if (call.attrs.get_bool("is_causal")) {
    const Value row = b.iota(DType::Int64, s.shape, 2), col = b.iota(DType::Int64, s.shape, 3);
    s = b.select(b.compare(Compare::LE, col, row), s, b.splat(kMinusInf, DType::Float32, s.shape));
  }
  const Value m = b.reduce(s, {3}, ReduceKind::Max);
  const Value e = b.exp(b.sub(s, expand_reduced(b, m, s, {3})));
  const Value sum = b.reduce(e, {3}, ReduceKind::Sum);
  const Value p = b.div(e, expand_reduced(b, sum, s, {3}));
  const Value out = b.dot_general(p, v, DotDims{{0, 1}, {0, 1}, {3}, {2}}, DType::Float32);
  return {b.convert(out, call.outputs[0].dtype())};
}

// x [M, K], weight [N, K], then as attrs say: bias [N], gate [G, 1 or N] (row i uses gate row i / (M / G)),
// residual [M, N], low-rank down [R, K] and up [N, R]. In float32: x W^T + bias + lowrank, activation, *
// gate,
// + residual; rounded once. The low-rank term rounds like the CPU's: x down^T and its product with up^T are
// each rounded to x's dtype (the pair runs as two products into the output before the base product adds onto
// it).
std::vector<Value> lower_linear_fused(HloBuilder& b, const runtime::OpCall& call,
                                      const std::vector<Value>& in) {
  const runtime::Attrs& a = call.attrs;
  size_t next = 2;
  const Value bias = a.get_bool("has_bias") ? in[next++] : Value{};
  const Value gate = a.get_bool("has_gate") ? in[next++] : Value{};
  const Value residual = a.get_bool("has_residual") ? in[next++] : Value{};
  const bool low_rank = a.get_bool("has_low_rank");
  const DType dtype = in[0].dtype;
  Value acc = linear_product(b, in[0], in[1]);
  if (bias.defined()) acc = add_bias_f32(b, acc, bias, 1);
  if (low_rank) {
    const Value thin = b.convert(linear_product(b, in[0], in[next]), dtype);
    const Value term = b.convert(linear_product(b, thin, in[next + 1]), dtype);
    acc = b.add(acc, b.convert(term, acc.dtype));
  }
  acc = activation(b, ops::activation_from_attr(a.get_int("act")), acc);
  if (gate.defined()) {
    const int64_t m = acc.shape[0], n = acc.shape[1], g = gate.shape[0];
    KILN_CHECK(g > 0 && m % g == 0,
               "linear_fused: gate " << shape_str(gate.shape) << " does not tile " << m << " rows");
    const Shape blocked{g, m / g, n};
    const Value gate_f = b.convert(gate, acc.dtype);
    const Value full = gate.shape[1] == n ? b.broadcast_in_dim(gate_f, blocked, {0, 2})
                                          : b.broadcast_in_dim(b.reshape(gate_f, {g}), blocked, {0});
    acc = b.mul(acc, b.reshape(full, acc.shape));
  }
  if (residual.defined()) acc = b.add(acc, b.convert(residual, acc.dtype));
  return {b.convert(acc, call.outputs[0].dtype())};
}

}  // namespace

void add_fused_lowerings(LoweringTable& t) {
  t.push_back({"scaled_dot_product_attention", lower_attention});
  t.push_back({"linear_fused", lower_linear_fused});
}

}  // namespace kiln::pjrt::hlo
