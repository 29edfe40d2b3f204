#include "models/flux_blocks.h"

#include "kiln/ops/attention.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "kiln/ops/nn.h"

namespace kiln::models {

FluxAttention::FluxAttention(int64_t dim, int64_t heads, int64_t head_dim, bool added_kv, bool pre_only,
                             const nn::TensorParallel& tp, bool bias, double eps)
    : heads_(tp.split(heads, "FluxTransformer2DModel num_attention_heads")),
      head_dim_(head_dim),
      // torch.nn.RMSNorm: the weight multiplies in float32 and the result is rounded once to x's dtype.
      norm_q_(head_dim, eps, true, RmsNormStyle::Torch),
      norm_k_(head_dim, eps, true, RmsNormStyle::Torch),
      to_q_(dim, heads * head_dim, bias, nn::column(tp)),
      to_k_(dim, heads * head_dim, bias, nn::column(tp)),
      to_v_(dim, heads * head_dim, bias, nn::column(tp)) {
  const int64_t inner = heads * head_dim;
  register_module("norm_q", &norm_q_);
  register_module("norm_k", &norm_k_);
  register_module("to_q", &to_q_);
  register_module("to_k", &to_k_);
  register_module("to_v", &to_v_);
  if (!pre_only) {
    to_out0_ = std::make_unique<nn::Linear>(inner, dim, bias, nn::row(tp));
    register_module("to_out.0", to_out0_.get());
  }
  if (added_kv) {
    norm_added_q_ = std::make_unique<nn::RMSNorm>(head_dim, eps, true, RmsNormStyle::Torch);
    norm_added_k_ = std::make_unique<nn::RMSNorm>(head_dim, eps, true, RmsNormStyle::Torch);
    add_q_proj_ = std::make_unique<nn::Linear>(dim, inner, bias, nn::column(tp));
    add_k_proj_ = std::make_unique<nn::Linear>(dim, inner, bias, nn::column(tp));
    add_v_proj_ = std::make_unique<nn::Linear>(dim, inner, bias, nn::column(tp));
    to_add_out_ = std::make_unique<nn::Linear>(inner, dim, bias, nn::row(tp));
    register_module("norm_added_q", norm_added_q_.get());
    register_module("norm_added_k", norm_added_k_.get());
    register_module("add_q_proj", add_q_proj_.get());
    register_module("add_k_proj", add_k_proj_.get());
    register_module("add_v_proj", add_v_proj_.get());
    register_module("to_add_out", to_add_out_.get());
  }
}

Tensor FluxAttention::heads(const nn::Linear& proj, const Tensor& x) const {
  return proj(x).view({x.size(0), x.size(1), heads_, head_dim_});
}

Tensor FluxAttention::heads_normed(const nn::Linear& proj, const nn::RMSNorm& norm, const Tensor& x) const {
  return norm(heads(proj, x));
}

std::pair<Tensor, Tensor> FluxAttention::forward_joint(const Tensor& x, const Tensor& c,
                                                       const FluxRopeTables& rope, const Tensor& bias) const {
  if (step_cache_ == nullptr || !step_cache_->forecasts_modules()) return joint(x, c, rope, bias);
  const std::vector<Tensor> out = step_cache_->module_outputs(this, [&] {
    const auto [image, text] = joint(x, c, rope, bias);
    return std::vector<Tensor>{image, text};
  });
  return {out[0], out[1]};
}

std::pair<Tensor, Tensor> FluxAttention::joint(const Tensor& x, const Tensor& c, const FluxRopeTables& rope,
                                               const Tensor& bias) const {
  // Text first along the sequence, for q, k, v and the rotary tables alike.
  const Tensor q =
      concat({heads_normed(*add_q_proj_, *norm_added_q_, c), heads_normed(to_q_, norm_q_, x)}, 1);
  const Tensor k =
      concat({heads_normed(*add_k_proj_, *norm_added_k_, c), heads_normed(to_k_, norm_k_, x)}, 1);
  const Tensor v = concat({heads(*add_v_proj_, c), heads(to_v_, x)}, 1);
  const Tensor out = rope_attention(q, k, v, rope.cos, rope.sin, bias);
  const int64_t text = c.size(1), image = x.size(1);
  return {(*to_out0_)(out.narrow(1, text, image)), (*to_add_out_)(out.narrow(1, 0, text))};
}

Tensor FluxAttention::forward_self(const Tensor& s, const FluxRopeTables& rope, const Tensor& bias) const {
  if (step_cache_ == nullptr || !step_cache_->forecasts_modules()) return self(s, rope, bias);
  return step_cache_->module_outputs(this, [&] { return std::vector<Tensor>{self(s, rope, bias)}; })[0];
}

Tensor FluxAttention::self(const Tensor& s, const FluxRopeTables& rope, const Tensor& bias) const {
  return rope_attention(heads_normed(to_q_, norm_q_, s), heads_normed(to_k_, norm_k_, s), heads(to_v_, s),
                        rope.cos, rope.sin, bias);
}

std::pair<Tensor, Tensor> double_stream_block(const FluxAttention& attn, const GeluTanhFeedForward& ff,
                                              const GeluTanhFeedForward& ff_context, const Tensor& x,
                                              const Tensor& c, const std::vector<Tensor>& m,
                                              const std::vector<Tensor>& mc, const FluxRopeTables& rope,
                                              const Tensor& bias) {
  enum { kShiftMsa, kScaleMsa, kGateMsa, kShiftMlp, kScaleMlp, kGateMlp };
  const Tensor nx = modulate(layer_norm_plain(x), m[kScaleMsa], m[kShiftMsa]);
  const Tensor nc = modulate(layer_norm_plain(c), mc[kScaleMsa], mc[kShiftMsa]);
  const auto [attn_x, attn_c] = attn.forward_joint(nx, nc, rope, bias);

  Tensor x1 = add(x, mul(m[kGateMsa].unsqueeze(1), attn_x));
  const Tensor ff_x = ff.forward(modulate(layer_norm_plain(x1), m[kScaleMlp], m[kShiftMlp]));
  x1 = add(x1, mul(m[kGateMlp].unsqueeze(1), ff_x));

  Tensor c1 = add(c, mul(mc[kGateMsa].unsqueeze(1), attn_c));
  const Tensor ff_c = ff_context.forward(modulate(layer_norm_plain(c1), mc[kScaleMlp], mc[kShiftMlp]));
  c1 = add(c1, mul(mc[kGateMlp].unsqueeze(1), ff_c));
  // diffusers clips only the text stream in this block.
  return {x1, clip_if_float16(c1)};
}

Tensor single_stream_block(const FluxAttention& attn, const nn::Linear& proj_mlp, const nn::Linear& proj_out,
                           const Tensor& s, const std::vector<Tensor>& m, const FluxRopeTables& rope,
                           const Tensor& bias) {
  enum { kShift, kScale, kGate };
  const Tensor n = modulate(layer_norm_plain(s), m[kScale], m[kShift]);
  const Tensor mlp = gelu(proj_mlp(n), GeluApproximate::Tanh);
  const Tensor attn_out = attn.forward_self(n, rope, bias);
  // proj_out reads [attention | mlp] along the features.
  const Tensor out = proj_out(concat({attn_out, mlp}, 2));
  return clip_if_float16(add(s, mul(m[kGate].unsqueeze(1), out)));
}

FluxTransformerBlock::FluxTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim,
                                           const nn::TensorParallel& tp)
    : norm1_(dim, 6, /*bias=*/true, tp),
      norm1_context_(dim, 6, /*bias=*/true, tp),
      attn_(dim, heads, head_dim, /*added_kv=*/true, /*pre_only=*/false, tp),
      ff_(dim, 4 * dim, tp),
      ff_context_(dim, 4 * dim, tp) {
  register_module("norm1", &norm1_);
  register_module("norm1_context", &norm1_context_);
  register_module("attn", &attn_);
  register_module("ff", &ff_);
  register_module("ff_context", &ff_context_);
}

std::pair<Tensor, Tensor> FluxTransformerBlock::forward(const Tensor& x, const Tensor& c,
                                                        const Tensor& silu_temb,
                                                        const FluxRopeTables& rope) const {
  if (!is_compiled()) return forward_eager(x, c, silu_temb, rope);
  const std::vector<Tensor> out =
      call_compiled({x, c, silu_temb, rope.cos, rope.sin}, [this](const auto& in) {
        const auto [x1, c1] = forward_eager(in[0], in[1], in[2], FluxRopeTables{in[3], in[4]});
        return std::vector<Tensor>{x1, c1};
      });
  return {out[0], out[1]};
}

std::pair<Tensor, Tensor> FluxTransformerBlock::forward_eager(const Tensor& x, const Tensor& c,
                                                              const Tensor& silu_temb,
                                                              const FluxRopeTables& rope) const {
  return double_stream_block(attn_, ff_, ff_context_, x, c, norm1_.forward(silu_temb),
                             norm1_context_.forward(silu_temb), rope);
}

FluxSingleTransformerBlock::FluxSingleTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim,
                                                       int64_t mlp_hidden, const nn::TensorParallel& tp)
    : norm_(dim, 3, /*bias=*/true, tp),
      proj_mlp_(dim, mlp_hidden, true, nn::column(tp)),
      proj_out_(heads * head_dim + mlp_hidden, dim, true, nn::row(tp, {heads * head_dim, mlp_hidden})),
      attn_(dim, heads, head_dim, /*added_kv=*/false, /*pre_only=*/true, tp) {
  register_module("norm", &norm_);
  register_module("proj_mlp", &proj_mlp_);
  register_module("proj_out", &proj_out_);
  register_module("attn", &attn_);
}

Tensor FluxSingleTransformerBlock::forward(const Tensor& s, const Tensor& silu_temb,
                                           const FluxRopeTables& rope) const {
  if (!is_compiled()) return forward_eager(s, silu_temb, rope);
  return call_compiled({s, silu_temb, rope.cos, rope.sin}, [this](const auto& in) {
    return std::vector<Tensor>{forward_eager(in[0], in[1], FluxRopeTables{in[2], in[3]})};
  })[0];
}

Tensor FluxSingleTransformerBlock::forward_eager(const Tensor& s, const Tensor& silu_temb,
                                                 const FluxRopeTables& rope) const {
  return single_stream_block(attn_, proj_mlp_, proj_out_, s, norm_.forward(silu_temb), rope);
}

}  // namespace kiln::models
