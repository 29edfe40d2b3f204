// Lowerings of scaled_dot_product_attention (src/backends/cpu/attention.cpp) and linear_fused
// (src/backends/cpu/fused_linear.cpp, linear_epilogue.h) as plain ops: XLA fuses them as it sees fit. On the
// cuda platform attention is instead one call of XLA's cuDNN flash attention (cudnn_attention below), as JAX
// emits it, where its dtypes and shapes allow.
#include <charconv>
#include <limits>
#include <string>

#include "backends/pjrt/stablehlo/lower_products.h"
#include "backends/pjrt/stablehlo/lowering_math.h"
#include "backends/pjrt/stablehlo/lowering_registry.h"
#include "backends/pjrt/stablehlo/lowering_target.h"
#include "kiln/core/error.h"
#include "ops/activation_op.h"

namespace kiln::pjrt::hlo {
namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// q [B, H, Sq, D], k [B, H, Skv, D], v [B, H, Skv, Dv], optional bias broadcast to [B, H, Sq, Skv] (float:
// added; bool: true attends, false masks); attrs scale, is_causal (query i sees keys j <= i). Scores, softmax
// and the product with v in float32 (16-bit operands are exact in float32). A row whose every key is masked
// is NaN, as in torch.
std::vector<Value> attention_composition(HloBuilder& b, const runtime::OpCall& call,
                                         const std::vector<Value>& in) {
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

// A double as Python's repr writes it (the shortest text that reads back as the same double, with ".0" on a
// whole number), so the backend config below matches JAX's json.dumps byte for byte.
std::string python_float(double x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// The backend config of XLA's cuDNN forward attention (xla/service/gpu/backend_configs.proto's
// GpuBackendConfig with a CudnnfMHABackendConfig), as JSON in the key order and spacing JAX 0.11.2's
// jax/_src/cudnn/fused_attention_stablehlo.py gives it for the BNTH layout ([B, N, T, H], Kiln's own): the
// cuDNN frontend's flash attention, the [B, N, T, S] score shape of the 16-bit element type, the two
// products' dimension numbers (Q.K^T contracting H with H, P.V contracting S with S, batch B and N), no
// dropout (JAX's default seed 42 is inert then), no sliding window, one segment per batch, no paging.
std::string cudnn_attention_config(int64_t batch, int64_t heads, int64_t seq_q, int64_t seq_kv, DType dtype,
                                   double scale, bool causal) {
  const auto str = [](int64_t v) { return "\"" + std::to_string(v) + "\""; };
  const auto dims = [](int lhs_contract, int rhs_contract) {
    return "{\"lhs_contracting_dimensions\": [\"" + std::to_string(lhs_contract) +
           "\"], \"rhs_contracting_dimensions\": [\"" + std::to_string(rhs_contract) +
           "\"], \"lhs_batch_dimensions\": [\"0\", \"1\"], \"rhs_batch_dimensions\": [\"0\", \"1\"]}";
  };
  return std::string("{\"operation_queue_id\": \"0\", \"cudnn_fmha_backend_config\": {") +
         "\"algorithm\": {\"algo_id\": \"0\", \"math_type\": \"TENSOR_OP_MATH\", \"tuning_knobs\": {\"17\": "
         "\"1\", \"24\": \"0\"}, \"is_cudnn_frontend\": true, \"workspace_size\": \"0\"}, " +
         "\"fmha_scale\": " + python_float(scale) + ", " +
         "\"intermediate_tensor_shape\": {\"element_type\": \"" +
         (dtype == DType::BFloat16 ? "BF16" : "F16") + "\", \"dimensions\": [" + str(batch) + ", " +
         str(heads) + ", " + str(seq_q) + ", " + str(seq_kv) +
         "], \"tuple_shapes\": [], \"layout\": {\"dim_level_types\": [], \"dim_unique\": [], "
         "\"dim_ordered\": [], \"minor_to_major\": [\"3\", \"2\", \"1\", \"0\"], \"tiles\": [], "
         "\"element_size_in_bits\": \"0\", \"memory_space\": \"0\", \"index_primitive_type\": "
         "\"PRIMITIVE_TYPE_INVALID\", \"pointer_primitive_type\": \"PRIMITIVE_TYPE_INVALID\", "
         "\"dynamic_shape_metadata_prefix_bytes\": \"0\"}, \"is_dynamic_dimension\": [false, false, false, "
         "false]}, \"is_flash_attention\": true, \"mask_type\": \"" +
         (causal ? "CAUSAL" : "NO_MASK") + "\", \"bmm1_dot_dimension_numbers\": " + dims(3, 3) +
         ", \"bmm2_dot_dimension_numbers\": " + dims(3, 2) +
         ", \"dropout_rate\": 0.0, \"seed\": 42, \"sliding_window_length\": 0, \"max_seg_per_batch\": 1, "
         "\"is_paged_attention\": false}}";
}

// Whether cuDNN's flash attention takes this call (what JAX checks before emitting it, made conservative
// where JAX asks the GPU: head dims up to 128, which every architecture since Ampere takes, not Hopper's
// 256): q, k, v of one 16-bit dtype, no bias (FLUX's and SD3's attention has none), equal head dims a
// multiple of 8, and a causal mask only on square scores (cuDNN's and torch's diagonals then agree).
bool cudnn_attention_fits(const runtime::OpCall& call, const std::vector<Value>& in) {
  const Value &q = in[0], &k = in[1], &v = in[2];
  const int64_t d = q.shape[3];
  return cudnn_attention_takes(q.dtype, d) && k.dtype == q.dtype && v.dtype == q.dtype &&
         call.outputs[0].dtype() == q.dtype && in.size() == 3 && v.shape[3] == d &&
         (!call.attrs.get_bool("is_causal") || q.shape[2] == k.shape[2]);
}

// `__cudnn$fmhaSoftmax(q, k, v)` with q, k, v in [B, N, T|S, H] row-major: the output [B, N, T, H] and a
// zero-size u8 workspace (XLA sizes the real one when it compiles), as JAX's inference lowering has it.
std::vector<Value> cudnn_attention(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& in) {
  const Value& q = in[0];
  const std::string config =
      cudnn_attention_config(q.shape[0], q.shape[1], q.shape[2], in[1].shape[2], q.dtype,
                             call.attrs.get_float("scale"), call.attrs.get_bool("is_causal"));
  const std::vector<Value> results =
      b.custom_call("__cudnn$fmhaSoftmax", {in[0], in[1], in[2]}, config,
                    {{q.dtype, {q.shape[0], q.shape[1], q.shape[2], in[2].shape[3]}}, {DType::UInt8, {0}}});
  return {results[0]};
}

// Attention without a bias as a loop over blocks of `block` keys (flash attention's arithmetic, in plain
// StableHLO): per block, the scores q k^T * scale in float32 (under is_causal, keys after the query at -inf),
// and a running row maximum m, sum l and output acc:
//   m' = max(m, max_j s_j),  l' = l e^(m - m') + sum_j e^(s_j - m'),  acc' = acc e^(m - m') + e^(s - m') v,
// the output acc / l at the end. The whole blocks run in a stablehlo.while, the keys left over (fewer than a
// block) once after it, so no key is padded or masked for its position. One block's scores are held at a
// time. Every row sees at least one key (the first, under is_causal too), so no row is left at -inf.
std::vector<Value> blockwise_attention(HloBuilder& b, const runtime::OpCall& call,
                                       const std::vector<Value>& in, int64_t block) {
  const Value &q = in[0], &k = in[1], &v = in[2];
  const int64_t batch = q.shape[0], heads = q.shape[1], queries = q.shape[2], keys = k.shape[2];
  const int64_t d = k.shape[3], dv = v.shape[3];
  const int64_t whole_blocks = keys / block, rest = keys % block;
  const bool causal = call.attrs.get_bool("is_causal");
  const float scale = static_cast<float>(call.attrs.get_float("scale"));
  struct Running {
    Value m, l, acc;
  };
  // One block's update: kb, vb its keys and values, `first` (an int64 scalar) its first key's index.
  auto step = [&](const Running& r, const Value& q_block, const Value& kb, const Value& vb,
                  const Value& first) {
    const Shape scores{batch, heads, queries, kb.shape[2]};
    Value s =
        b.dot_general(to_f32(b, q_block), to_f32(b, kb), DotDims{{0, 1}, {0, 1}, {3}, {3}}, DType::Float32);
    s = b.mul(s, b.splat(scale, DType::Float32, scores));
    if (causal) {
      const Value key = b.add(b.iota(DType::Int64, scores, 3), b.broadcast_to(first, scores));
      s = b.select(b.compare(Compare::LE, key, b.iota(DType::Int64, scores, 2)), s,
                   b.splat(kMinusInf, DType::Float32, scores));
    }
    const Value m = b.max(r.m, b.reduce(s, {3}, ReduceKind::Max));
    const Value p = b.exp(b.sub(s, expand_reduced(b, m, s, {3})));
    const Value correction = b.exp(b.sub(r.m, m));
    const Value l = b.add(b.mul(r.l, correction), b.reduce(p, {3}, ReduceKind::Sum));
    const Value pv = b.dot_general(p, to_f32(b, vb), DotDims{{0, 1}, {0, 1}, {3}, {2}}, DType::Float32);
    return Running{m, l, b.add(b.mul(r.acc, expand_reduced(b, correction, r.acc, {3})), pv)};
  };
  const Shape rows{batch, heads, queries};
  const std::vector<Value> done = b.while_loop(
      {b.scalar(0, DType::Int64), b.splat(kMinusInf, DType::Float32, rows), b.splat(0, DType::Float32, rows),
       b.splat(0, DType::Float32, {batch, heads, queries, dv}), q, k, v},
      [&](const std::vector<Value>& c) {
        return b.compare(Compare::LT, c[0], b.scalar(static_cast<double>(whole_blocks), DType::Int64));
      },
      [&](const std::vector<Value>& c) {
        const Value first = b.mul(c[0], b.scalar(static_cast<double>(block), DType::Int64));
        const Value zero = b.scalar(0, DType::Int64);
        const Value kb = b.dynamic_slice(c[5], {zero, zero, first, zero}, {batch, heads, block, d});
        const Value vb = b.dynamic_slice(c[6], {zero, zero, first, zero}, {batch, heads, block, dv});
        const Running r = step({c[1], c[2], c[3]}, c[4], kb, vb, first);
        return std::vector<Value>{b.add(c[0], b.scalar(1, DType::Int64)), r.m, r.l, r.acc, c[4], c[5], c[6]};
      });
  Running r{done[1], done[2], done[3]};
  if (rest > 0)
    r = step(r, q, b.slice_dim(k, 2, keys - rest, keys), b.slice_dim(v, 2, keys - rest, keys),
             b.scalar(static_cast<double>(keys - rest), DType::Int64));
  const Value out = b.div(r.acc, expand_reduced(b, r.l, r.acc, {3}));
  return {b.convert(out, call.outputs[0].dtype())};
}

std::vector<Value> lower_attention(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& in) {
  if (b.target().cudnn_attention && cudnn_attention_fits(call, in)) return cudnn_attention(b, call, in);
  const int64_t block = b.target().attention_key_block;
  if (block > 0 && in.size() == 3 && in[1].shape[2] > block) return blockwise_attention(b, call, in, block);
  return attention_composition(b, call, in);
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

bool cudnn_attention_takes(DType dtype, int64_t head_dim) {
  return (dtype == DType::BFloat16 || dtype == DType::Float16) && head_dim % 8 == 0 && head_dim <= 128;
}

void add_fused_lowerings(LoweringTable& t) {
  t.push_back({"scaled_dot_product_attention", lower_attention});
  t.push_back({"linear_fused", lower_linear_fused});
}

}  // namespace kiln::pjrt::hlo
