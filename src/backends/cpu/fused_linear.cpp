// "linear_fused": oneDNN's matmul with the epilogue as post-ops (sum of the low-rank product, eltwise
// activation, binary mul by the gate, binary add of the residual), applied to the float32 accumulator before
// the one rounding to the output; with bf16 weights, Kiln's f32-FMA or AMX GEMM where that is this host's
// faster path (matmul_path.h, linear_own_gemm.h), with the same epilogue in the same order.
//  inputs: x [M, K] (row- or column-major), weight [N, K], then when present (attrs has_bias, has_gate,
//          has_residual, has_low_rank): bias [N] (x's dtype or float32), gate [G, 1 or N] (x's dtype; G = 1:
//          one row for all rows; G = M: full [M, N]; else row block b of M / G consecutive rows uses gate row
//          b), residual [M, N] contiguous (x's dtype), down [R, K] and up [N, R] (x's dtype; not float16).
// The low-rank pair (a LoRA adapter) costs two thin products and no pass of its own over the output:
// (x down^T) up^T is written into the output first, and the base product accumulates onto it (oneDNN's sum
// post-op, ahead of the others) - instead of a separate add that reads two [M, N] tensors and writes a third.
//  output: [M, N] dense; attrs act (Activation), prepack (bool).
// The weight goes through onednn::matmul_with_weight like the "linear" kernel's: a weight used by both ops
// is packed once, in the layout its first consumer chose.
#include "backends/cpu/fused_kernels.h"
#include "backends/cpu/linear_own_gemm.h"
#include "backends/cpu/onednn_util.h"
#include "kiln/ops/fused.h"
#include "ops/activation_op.h"

namespace kiln::cpu_kernels {

namespace {

using dnnl::memory;
using Md = memory::desc;

using onednn::compute_type;
using onednn::Operand;

constexpr const char* kOp = "linear_fused";

Operand operand(const Tensor& t, const Shape& shape, const Strides& strides) {
  return onednn::operand(t, shape, strides, kOp);
}
Operand operand(const Tensor& t) {
  return onednn::operand(t, kOp);
}

dnnl::algorithm eltwise_algorithm(Activation act) {
  switch (act) {
    case Activation::Gelu:
      return dnnl::algorithm::eltwise_gelu_erf;
    case Activation::GeluTanh:
      return dnnl::algorithm::eltwise_gelu_tanh;
    case Activation::Silu:
      return dnnl::algorithm::eltwise_swish;  // x * sigmoid(alpha x) with alpha = 1
    case Activation::None:
      break;
  }
  KILN_FAIL("linear_fused: internal: no eltwise post-op for activation " << static_cast<int>(act));
}

// dst [M, N] (dense) = a [M, K] @ b^T for b [N, K], both row- or column-major: the thin products of the
// low-rank pair.
void thin_product(const Tensor& a, const Tensor& b, const Tensor& dst) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  const Md a_md = onednn::plain_desc({m, k}, a.strides(), a.dtype(), kOp);
  const Md b_md = onednn::plain_desc({k, n}, {b.stride(1), b.stride(0)}, b.dtype(), kOp);
  const Md dst_md = onednn::dense_desc({m, n}, onednn::data_type(dst.dtype(), kOp));
  const std::string key = onednn::KeyBuilder("linear_fused.low_rank").add(a_md).add(b_md).add(dst_md).str();
  const auto cached = onednn::PrimitiveCache<dnnl::matmul>::get(key, [&] {
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, dst_md), onednn::default_attr(),
                                        onednn::engine());
  });
  onednn::execute(cached->primitive, cached->pd,
                  {{DNNL_ARG_SRC, memory(a_md, onednn::engine(), a.raw_data())},
                   {DNNL_ARG_WEIGHTS, memory(b_md, onednn::engine(), b.raw_data())},
                   {DNNL_ARG_DST, memory(dst_md, onednn::engine(), dst.raw_data())}});
}

// out = (x down^T) up^T: the low-rank pair's product, which the base product then accumulates onto.
void low_rank_into_output(const Tensor& x, const Tensor& down, const Tensor& up, const Tensor& out) {
  KILN_CHECK(x.dtype() != float16, "linear_fused: internal: no low-rank product in float16");
  const Tensor thin = Tensor::empty({x.size(0), down.size(0)}, x.dtype());
  thin_product(x, down, thin);
  thin_product(thin, up, out);
}

}  // namespace

void linear_fused_kernel(const runtime::OpCall& call) {
  const bool has_bias = call.attrs.get_bool("has_bias");
  const bool has_gate = call.attrs.get_bool("has_gate");
  const bool has_residual = call.attrs.get_bool("has_residual");
  const Activation act = ops::activation_from_attr(call.attrs.get_int("act"));
  size_t next = 2;
  const Tensor& x = call.inputs[0];
  const Tensor& w = call.inputs[1];
  const Tensor* bias = has_bias ? &call.inputs[next++] : nullptr;
  const Tensor* gate = has_gate ? &call.inputs[next++] : nullptr;
  const Tensor* residual = has_residual ? &call.inputs[next++] : nullptr;
  const bool low_rank = call.attrs.get_bool("has_low_rank");
  const Tensor& out = call.outputs[0];
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  const memory::data_type ct = compute_type(x.dtype());
  const bool f16 = x.dtype() == float16;
  if (const OwnGemm gemm = own_gemm_for(x, w); gemm != OwnGemm::None) {
    if (low_rank) low_rank_into_output(x, call.inputs[next], call.inputs[next + 1], out);
    return linear_own_gemm(gemm, x, w, bias, act, gate, residual, low_rank, call.attrs.get_bool("prepack"),
                           out);
  }

  // Row blocks: one oneDNN call per block when the gate has one row per block of rows (adaLN's [B, 1, N]
  // with B > 1); otherwise the whole product is one call.
  const int64_t gate_rows = gate != nullptr ? gate->size(0) : 1;
  const bool blocked = gate_rows > 1 && gate_rows < m;
  const int64_t blocks = blocked ? gate_rows : 1;
  const int64_t rows = m / blocks;
  KILN_CHECK(rows * blocks == m && (gate == nullptr || gate_rows == 1 || blocked || gate->size(1) == n),
             "linear_fused: internal: gate " << shape_str(gate->shape()) << " does not tile output "
                                             << shape_str(out.shape()));

  const Md w_plain = onednn::plain_desc({k, n}, {w.stride(1), w.stride(0)}, w.dtype(), "linear_fused");
  const bool pack = call.attrs.get_bool("prepack") || f16;
  Operand b;
  if (bias != nullptr) b = operand(*bias, {1, n}, {n, 1});
  const memory::data_type out_dt =
      f16 ? memory::data_type::f32 : onednn::data_type(out.dtype(), "linear_fused");
  const Md dst_md = onednn::dense_desc({rows, n}, out_dt);
  const Md src_md = f16 ? onednn::dense_desc({rows, k}, memory::data_type::f32)
                        : onednn::plain_desc({rows, k}, x.strides(), x.dtype(), "linear_fused");
  const memory::data_type side_dt = f16 ? memory::data_type::f32 : ct;
  const Md gate_md =
      gate != nullptr ? onednn::dense_desc({blocked ? 1 : gate_rows, gate->size(1)}, side_dt) : Md();
  const Md residual_md = onednn::dense_desc({rows, n}, side_dt);

  const auto [cached, weights] = onednn::matmul_with_weight(
      w, w_plain, pack, ct,
      [&](const Md& w_md) {
        onednn::KeyBuilder key("linear_fused");
        key.add(src_md).add(w_md).add(dst_md).add(static_cast<int64_t>(act));
        // Which operands are present, not only their descriptions: a [1, N] bias and a [1, N] gate describe
        // alike, and a primitive made for one cannot run with the other.
        key.add(int64_t{bias != nullptr} | int64_t{gate != nullptr} << 1 | int64_t{residual != nullptr} << 2 |
                int64_t{low_rank} << 3);
        if (bias != nullptr) key.add(b.desc);
        if (gate != nullptr) key.add(gate_md);
        if (residual != nullptr) key.add(residual_md);
        return key.str();
      },
      [&](const Md& w_md) {
        dnnl::post_ops ops;
        if (low_rank) ops.append_sum(1.0f);  // the low-rank product already in the output
        if (act != Activation::None)
          ops.append_eltwise(1.0f, eltwise_algorithm(act), act == Activation::Silu ? 1.0f : 0.0f, 0.0f);
        if (gate != nullptr) ops.append_binary(dnnl::algorithm::binary_mul, gate_md);
        if (residual != nullptr) ops.append_binary(dnnl::algorithm::binary_add, residual_md);
        dnnl::primitive_attr attr = onednn::default_attr();
        attr.set_post_ops(ops);
        const dnnl::matmul::desc desc = bias != nullptr ? dnnl::matmul::desc(src_md, w_md, b.desc, dst_md)
                                                        : dnnl::matmul::desc(src_md, w_md, dst_md);
        return dnnl::matmul::primitive_desc(desc, attr, onednn::engine());
      });
  // Post-op indices of the gate's and the residual's binary ops.
  const int gate_arg = (low_rank ? 1 : 0) + (act != Activation::None ? 1 : 0);
  const int residual_arg = gate_arg + (gate != nullptr ? 1 : 0);

  if (low_rank) low_rank_into_output(x, call.inputs[next], call.inputs[next + 1], out);

  for (int64_t blk = 0; blk < blocks; ++blk) {
    const Tensor xb = x.narrow(0, blk * rows, rows);
    const Tensor ob = out.narrow(0, blk * rows, rows);
    const Operand src = operand(xb, {rows, k}, xb.strides());
    Tensor out_f32;  // float16: the float32 result, rounded into `ob` afterwards
    if (f16) out_f32 = Tensor::empty({rows, n}, float32);
    const memory dst(dst_md, onednn::engine(), f16 ? out_f32.raw_data() : ob.raw_data());
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, src.mem}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}};
    if (bias != nullptr) args.insert({DNNL_ARG_BIAS, b.mem});
    Operand g, r;
    if (gate != nullptr) {
      g = operand(blocked ? gate->narrow(0, blk, 1) : *gate);
      args.insert({DNNL_ARG_ATTR_MULTIPLE_POST_OP(gate_arg) | DNNL_ARG_SRC_1, g.mem});
    }
    if (residual != nullptr) {
      r = operand(residual->narrow(0, blk * rows, rows));
      args.insert({DNNL_ARG_ATTR_MULTIPLE_POST_OP(residual_arg) | DNNL_ARG_SRC_1, r.mem});
    }
    onednn::execute(cached->primitive, cached->pd, std::move(args));
    if (f16) {
      const memory half(onednn::dense_desc({rows, n}, memory::data_type::f16), onednn::engine(),
                        ob.raw_data());
      onednn::reorder(dst, half);
    }
  }
}

}  // namespace kiln::cpu_kernels
