// Lowerings of the layout ops (src/backends/cpu/layout.cpp, rope_tables.cpp): concat, embedding,
// upsample_nearest2d, rope and FLUX's RoPE tables.
#include <cmath>

#include "backends/pjrt/stablehlo/lowering_math.h"
#include "backends/pjrt/stablehlo/lowering_registry.h"
#include "kiln/core/error.h"
#include "ops/nearest_index.h"

namespace kiln::pjrt::hlo {
namespace {

// Inputs are already in the output's dtype (the front end converts them).
std::vector<Value> lower_concat(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& in) {
  return {b.concatenate(in, call.attrs.get_int("dim"))};
}

// weight [V, D], ids [...] (int32 / int64) -> [..., D]. Out-of-range ids are clamped by gather (the CPU
// kernel throws; the device cannot): the front end's callers pass valid token ids.
std::vector<Value> lower_embedding(HloBuilder& b, const runtime::OpCall&, const std::vector<Value>& in) {
  const Value& weight = in[0];
  const Value& ids = in[1];
  const GatherDims dims{{ids.rank()}, {0}, {0}, ids.rank()};
  return {b.gather(weight, ids, dims, {1, weight.shape[1]})};
}

// x with dim `dim` resampled to `out` elements by nearest neighbour.
Value resample_dim(HloBuilder& b, const Value& x, int64_t dim, int64_t out, int64_t scale) {
  const int64_t in = x.shape[static_cast<size_t>(dim)];
  if (out == in) return x;
  std::vector<int64_t> src;
  bool repeats = out % in == 0;
  for (int64_t i = 0; i < out; ++i) {
    src.push_back(ops::nearest_source(i, in, out, scale));
    repeats = repeats && src.back() == i / (out / in);
  }
  if (repeats) {
    // An integer factor: each element repeated, as broadcast + reshape (no gather).
    Shape repeated = x.shape;
    repeated.insert(repeated.begin() + dim + 1, out / in);
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < x.rank(); ++d) dims.push_back(d <= dim ? d : d + 1);
    Shape result = x.shape;
    result[static_cast<size_t>(dim)] = out;
    return b.reshape(b.broadcast_in_dim(x, repeated, dims), result);
  }
  const Value idx = b.constant_ints(src, DType::Int64, {out});
  std::vector<int64_t> offset_dims, slice_sizes = x.shape;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != dim) offset_dims.push_back(d);
  slice_sizes[static_cast<size_t>(dim)] = 1;
  // The gathered dim comes out at the position the offset dims leave free: `dim`.
  return b.gather(x, idx, GatherDims{offset_dims, {dim}, {dim}, 1}, slice_sizes);
}

std::vector<Value> lower_upsample(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& in) {
  const Shape& out = call.outputs[0].shape();
  const int64_t scale = call.attrs.get_int("scale");
  return {resample_dim(b, resample_dim(b, in[0], 2, out[2], scale), 3, out[3], scale)};
}

// x [B, H, S, D]; cos, sin float32 [S, D]: x * cos + rotate(x) * sin in float32, rotate pairing (2i, 2i+1)
// (Interleaved, style 0) or the halves (RotateHalf, style 1).
std::vector<Value> lower_rope(HloBuilder& b, const runtime::OpCall& call, const std::vector<Value>& in) {
  const Value x = to_f32(b, in[0]);
  const Shape& shape = x.shape;
  const int64_t d = shape[3];
  Value rotated;
  if (call.attrs.get_int("style") == 0) {
    const Value pairs = b.reshape(x, {shape[0], shape[1], shape[2], d / 2, 2});
    const Value even = b.slice_dim(pairs, 4, 0, 1), odd = b.slice_dim(pairs, 4, 1, 2);
    rotated = b.reshape(b.concatenate({b.neg(odd), even}, 4), shape);
  } else {
    const Value lo = b.slice_dim(x, 3, 0, d / 2), hi = b.slice_dim(x, 3, d / 2, d);
    rotated = b.concatenate({b.neg(hi), lo}, 3);
  }
  const Value c = b.broadcast_in_dim(to_f32(b, in[1]), shape, {2, 3});
  const Value s = b.broadcast_in_dim(to_f32(b, in[2]), shape, {2, 3});
  return {b.convert(b.add(b.mul(x, c), b.mul(rotated, s)), call.outputs[0].dtype())};
}

// ids float32 [S, axes] -> cos, sin float32 [S, head_dim]: per axis of d dims, angle = pos * theta^(-2k/d) in
// float64 (as the CPU kernel and diffusers), each value repeated for the pair it rotates. float64 runs on the
// CPU and GPU plugins; TPUs have no float64.
std::vector<Value> lower_flux_rope_tables(HloBuilder& b, const runtime::OpCall& call,
                                          const std::vector<Value>& in) {
  const Value& ids = in[0];
  const int64_t seq = ids.shape[0];
  const double theta = call.attrs.get_float("theta");
  std::vector<Value> cos_parts, sin_parts;
  int64_t a = 0;
  for (int64_t d : call.attrs.get_ints("axes_dims")) {
    const int64_t half = d / 2;
    const Value pos = b.broadcast_in_dim(
        b.reshape(b.convert(b.slice_dim(ids, 1, a, a + 1), DType::Float64), {seq}), {seq, half}, {0});
    // inv_freq as a [half] float64 row: 1 / theta^(2k/d), built from an iota so the text stays small.
    const Value k2 = b.convert(b.iota(DType::Int64, {half}, 0), DType::Float64);
    const Value expo = b.div(b.mul(k2, b.splat(2.0, DType::Float64, {half})),
                             b.splat(static_cast<double>(d), DType::Float64, {half}));
    const Value inv_freq =
        b.div(b.splat(1.0, DType::Float64, {half}), b.pow(b.splat(theta, DType::Float64, {half}), expo));
    const Value angle = b.mul(pos, b.broadcast_in_dim(inv_freq, {seq, half}, {1}));
    auto paired = [&](const Value& v) {
      return b.reshape(b.broadcast_in_dim(b.convert(v, DType::Float32), {seq, half, 2}, {0, 1}), {seq, d});
    };
    cos_parts.push_back(paired(b.cos(angle)));
    sin_parts.push_back(paired(b.sin(angle)));
    ++a;
  }
  return {b.concatenate(cos_parts, 1), b.concatenate(sin_parts, 1)};
}

}  // namespace

void add_layout_lowerings(LoweringTable& t) {
  t.push_back({"concat", lower_concat});
  t.push_back({"embedding", lower_embedding});
  t.push_back({"upsample_nearest2d", lower_upsample});
  t.push_back({"rope", lower_rope});
  t.push_back({"flux_rope_tables", lower_flux_rope_tables});
}

}  // namespace kiln::pjrt::hlo
