#include "models/dit_layers.h"

#include "kiln/ops/attention.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "kiln/ops/nn.h"

namespace kiln::models {

namespace {

// float16's largest finite value.
constexpr double kFloat16Max = 65504.0;

}  // namespace

Tensor layer_norm_plain(const Tensor& x, double eps) {
  return layer_norm(x, 1, Tensor(), Tensor(), eps);
}

Tensor modulate(const Tensor& normed, const Tensor& scale, const Tensor& shift) {
  return add(mul(normed, add(1.0, scale).unsqueeze(1)), shift.unsqueeze(1));
}

Tensor gated_residual(const Tensor& x, const Tensor& gate, const Tensor& y) {
  return add(x, mul(gate.unsqueeze(1), y));
}

Tensor clip_if_float16(const Tensor& x) {
  return x.dtype() == float16 ? clamp(x, -kFloat16Max, kFloat16Max) : x;
}

Tensor rope_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos, const Tensor& sin,
                      const Tensor& bias) {
  const int64_t batch = q.size(0), seq = q.size(1), features = q.size(2) * q.size(3);
  // apply_rope and attention work on [B, H, S, D]; the transposes are views of the [B, S, H, D] projections.
  const Tensor qr = apply_rope(q.transpose(1, 2), cos, sin, RopeStyle::Interleaved);
  const Tensor kr = apply_rope(k.transpose(1, 2), cos, sin, RopeStyle::Interleaved);
  const Tensor out = scaled_dot_product_attention(qr, kr, v.transpose(1, 2), {.bias = bias});
  // Head-major features (head * D + d), as hidden_states.flatten(2, 3) gives.
  return out.transpose(1, 2).reshape({batch, seq, features});
}

Modulation::Modulation(int64_t dim, int64_t chunks, bool bias, const nn::TensorParallel& tp)
    : linear(dim, chunks * dim, bias, nn::column_gathered(tp)), chunks_(chunks) {
  register_module("linear", &linear);
}

std::vector<Tensor> Modulation::forward(const Tensor& silu_temb) const {
  return chunk(linear(silu_temb), chunks_, 1);
}

AdaLayerNormContinuous::AdaLayerNormContinuous(int64_t dim, bool bias, const nn::TensorParallel& tp,
                                               double eps)
    : linear_(dim, 2 * dim, bias, nn::column_gathered(tp)), eps_(eps) {
  register_module("linear", &linear_);
}

Tensor AdaLayerNormContinuous::forward(const Tensor& x, const Tensor& silu_temb) const {
  // diffusers: linear(silu(temb).to(x.dtype)), then scale, shift = chunk(2).
  const std::vector<Tensor> m = chunk(linear_(silu_temb.to(x.dtype())), 2, 1);
  return modulate(layer_norm_plain(x, eps_), /*scale=*/m[0], /*shift=*/m[1]);
}

GeluTanhFeedForward::GeluTanhFeedForward(int64_t dim, int64_t hidden, const nn::TensorParallel& tp)
    : proj_(dim, hidden, true, nn::column(tp)), out_(hidden, dim, true, nn::row(tp)) {
  register_module("net.0.proj", &proj_);
  register_module("net.2", &out_);
}

Tensor GeluTanhFeedForward::forward(const Tensor& x) const {
  return out_(gelu(proj_(x), GeluApproximate::Tanh));
}

}  // namespace kiln::models
