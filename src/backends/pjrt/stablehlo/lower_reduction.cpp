// Lowerings of the reductions (sum, mean, max, var on [outer, r, inner] -> [outer, inner]), softmax and the
// norms (src/backends/cpu/reduction.cpp, isa/norm_kernels.cpp, isa/fused_norm_modulate_rows.cpp). 16-bit
// floats compute in float32 and round once; the statistics are two-pass (mean, then the centred sum of
// squares) as on the CPU.
#include "backends/pjrt/stablehlo/lowering_math.h"
#include "backends/pjrt/stablehlo/lowering_registry.h"
#include "kiln/core/error.h"

namespace kiln::pjrt::hlo {
namespace {

// The dtype a reduction computes in: float32 for the 16-bit floats, float64 stays, integers and bool sum as
// int64 (the output's dtype) and take their max in their own dtype.
DType reduce_compute(const Value& x, DType out) {
  if (is_float_math(x.dtype)) return DType::Float32;
  return x.dtype == DType::Float64 ? DType::Float64 : out;
}

std::vector<Value> lower_sum_mean(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& in) {
  const DType out = call.outputs[0].dtype();
  const Value x = b.convert(in[0], reduce_compute(in[0], out));
  const Value r = call.op == "mean" ? mean_over(b, x, {1}) : b.reduce(x, {1}, ReduceKind::Sum);
  return {b.convert(r, out)};
}

std::vector<Value> lower_max(HloBuilder& b, const runtime::OpCall&, const std::vector<Value>& in) {
  // No conversion needed: max is exact in any dtype.
  return {b.reduce(in[0], {1}, ReduceKind::Max)};
}

// Centred variance over `dims` of float x: sum((x - mean)^2) / max(0, count - correction).
Value variance(HloBuilder& b, const Value& x, const std::vector<int64_t>& dims, const Value& mean,
               int64_t correction) {
  int64_t count = 1;
  for (int64_t d : dims) count *= x.shape[static_cast<size_t>(d)];
  const Value centred = b.sub(x, expand_reduced(b, mean, x, dims));
  const Value m2 = b.reduce(b.mul(centred, centred), dims, ReduceKind::Sum);
  const double denom = std::max<double>(0.0, static_cast<double>(count - correction));
  return b.div(m2, b.splat(denom, m2.dtype, m2.shape));
}

std::vector<Value> lower_var(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& in) {
  const DType out = call.outputs[0].dtype();
  const Value x = b.convert(in[0], reduce_compute(in[0], out));
  const Value mean = mean_over(b, x, {1});
  return {b.convert(variance(b, x, {1}, mean, call.attrs.get_int("correction")), out)};
}

// softmax over dim 1 of [rows, n]: exp(x - max) * (1 / sum), as the kernel multiplies by the inverse.
std::vector<Value> lower_softmax(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& in) {
  const Value x = to_f32(b, in[0]);
  const Value m = b.reduce(x, {1}, ReduceKind::Max);
  const Value e = b.exp(b.sub(x, expand_reduced(b, m, x, {1})));
  const Value s = b.reduce(e, {1}, ReduceKind::Sum);
  const Value inv = b.div(b.splat(1.0, DType::Float32, s.shape), s);
  return {b.convert(b.mul(e, expand_reduced(b, inv, x, {1})), call.outputs[0].dtype())};
}

// 1 / sqrt(v + eps), the kernels' rstd.
Value rstd_of(HloBuilder& b, const Value& v, double eps) {
  const Value one = b.splat(1.0, v.dtype, v.shape);
  return b.div(one, b.sqrt(b.add(v, b.splat(static_cast<float>(eps), v.dtype, v.shape))));
}

// A float32 [n] parameter broadcast along the last dim of x.
Value along_last(HloBuilder& b, const Value& p, const Value& x) {
  return b.broadcast_in_dim(to_f32(b, p), x.shape, {x.rank() - 1});
}

std::vector<Value> lower_layer_norm(HloBuilder& b, const runtime::OpCall& call,
                                    const std::vector<Value>& in) {
  const Value x = to_f32(b, in[0]);
  const Value mean = mean_over(b, x, {1});
  const Value rstd = rstd_of(b, variance(b, x, {1}, mean, 0), call.attrs.get_float("eps"));
  Value y = b.mul(b.sub(x, expand_reduced(b, mean, x, {1})), expand_reduced(b, rstd, x, {1}));
  if (in[1].defined()) y = b.mul(y, along_last(b, in[1], x));
  if (in[2].defined()) y = b.add(y, along_last(b, in[2], x));
  return {b.convert(y, call.outputs[0].dtype())};
}

// h = round_to(h_dtype, x * rstd), then times the weight, in the output's dtype.
std::vector<Value> lower_rms_norm(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& in) {
  const Value x = to_f32(b, in[0]);
  const Value ms = mean_over(b, b.mul(x, x), {1});
  const Value r = rstd_of(b, ms, call.attrs.get_float("eps"));
  const auto h_dtype = static_cast<DType>(call.attrs.get_int("h_dtype"));
  Value h = to_f32(b, b.convert(b.mul(x, expand_reduced(b, r, x, {1})), h_dtype));
  if (in[1].defined()) h = b.mul(h, along_last(b, in[1], x));
  return {b.convert(h, call.outputs[0].dtype())};
}

// [N, C, S] in groups of C / G channels: (x - mean) * (rstd * w[c]) + b[c].
std::vector<Value> lower_group_norm(HloBuilder& b, const runtime::OpCall& call,
                                    const std::vector<Value>& in) {
  const Value x = to_f32(b, in[0]);
  const int64_t n = x.shape[0], c = x.shape[1], s = x.shape[2], g = call.attrs.get_int("groups");
  const Value grouped = b.reshape(x, {n, g, (c / g) * s});
  const Value mean = mean_over(b, grouped, {2});
  const Value rstd = rstd_of(b, variance(b, grouped, {2}, mean, 0), call.attrs.get_float("eps"));
  const Shape by_channel{n, g, c / g, s};
  const Value x4 = b.reshape(x, by_channel);
  Value scale = b.broadcast_in_dim(rstd, by_channel, {0, 1});
  if (in[1].defined())
    scale = b.mul(scale, b.broadcast_in_dim(b.reshape(to_f32(b, in[1]), {g, c / g}), by_channel, {1, 2}));
  Value y = b.mul(b.sub(x4, b.broadcast_in_dim(mean, by_channel, {0, 1})), scale);
  if (in[2].defined())
    y = b.add(y, b.broadcast_in_dim(b.reshape(to_f32(b, in[2]), {g, c / g}), by_channel, {1, 2}));
  return {b.convert(b.reshape(y, x.shape), call.outputs[0].dtype())};
}

// x [rows, C]; scale, shift float32 [blocks, C], row i using table row i / block_rows:
// (x - mean) * ((1 + scale) * rstd) + shift (mean 0 for RmsNorm, kind 1).
std::vector<Value> lower_norm_modulate(HloBuilder& b, const runtime::OpCall& call,
                                       const std::vector<Value>& in) {
  const Value x = to_f32(b, in[0]);
  const bool layer_norm = call.attrs.get_int("kind") == 0;
  const double eps = call.attrs.get_float("eps");
  const int64_t rows = x.shape[0], c = x.shape[1], block_rows = call.attrs.get_int("block_rows");
  KILN_CHECK(block_rows > 0 && rows % block_rows == 0,
             "norm_modulate: " << rows << " rows are not whole blocks of " << block_rows);
  Value centred = x, rstd;
  if (layer_norm) {
    const Value mean = mean_over(b, x, {1});
    centred = b.sub(x, expand_reduced(b, mean, x, {1}));
    rstd = rstd_of(b, mean_over(b, b.mul(centred, centred), {1}), eps);
  } else {
    rstd = rstd_of(b, mean_over(b, b.mul(x, x), {1}), eps);
  }
  const Shape blocked{rows / block_rows, block_rows, c};
  auto table = [&](const Value& t) {
    return b.reshape(b.broadcast_in_dim(to_f32(b, t), blocked, {0, 2}), x.shape);
  };
  const Value factor =
      b.mul(b.add(b.splat(1.0, DType::Float32, x.shape), table(in[1])), expand_reduced(b, rstd, x, {1}));
  const Value y = b.add(b.mul(centred, factor), table(in[2]));
  return {b.convert(y, call.outputs[0].dtype())};
}

}  // namespace

void add_reduction_lowerings(LoweringTable& t) {
  t.push_back({"sum", lower_sum_mean});
  t.push_back({"mean", lower_sum_mean});
  t.push_back({"max", lower_max});
  t.push_back({"var", lower_var});
  t.push_back({"softmax", lower_softmax});
  t.push_back({"layer_norm", lower_layer_norm});
  t.push_back({"rms_norm", lower_rms_norm});
  t.push_back({"group_norm", lower_group_norm});
  t.push_back({"norm_modulate", lower_norm_modulate});
}

}  // namespace kiln::pjrt::hlo
