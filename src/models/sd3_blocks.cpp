#include "models/sd3_blocks.h"

#include <vector>

#include "kiln/ops/attention.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "kiln/ops/nn.h"

namespace kiln::models {

namespace {

// Attention(eps=1e-6) passes this eps to its QK RMSNorms.
constexpr double kQkNormEps = 1e-6;

std::unique_ptr<nn::RMSNorm> make_qk_norm(bool enabled, int64_t head_dim) {
  return enabled ? std::make_unique<nn::RMSNorm>(head_dim, kQkNormEps) : nullptr;
}

}  // namespace

SD3Attention::SD3Attention(int64_t dim, int64_t heads, int64_t head_dim, bool qk_norm, bool added_kv,
                           bool context_pre_only, const nn::TensorParallel& tp)
    : heads_(tp.split(heads, "SD3Transformer2DModel num_attention_heads")),
      head_dim_(head_dim),
      to_q_(dim, heads * head_dim, true, nn::column(tp)),
      to_k_(dim, heads * head_dim, true, nn::column(tp)),
      to_v_(dim, heads * head_dim, true, nn::column(tp)),
      to_out0_(heads * head_dim, dim, true, nn::row(tp)),
      norm_q_(make_qk_norm(qk_norm, head_dim)),
      norm_k_(make_qk_norm(qk_norm, head_dim)) {
  const int64_t inner = heads * head_dim;
  if (norm_q_) {
    register_module("norm_q", norm_q_.get());
    register_module("norm_k", norm_k_.get());
  }
  register_module("to_q", &to_q_);
  register_module("to_k", &to_k_);
  register_module("to_v", &to_v_);
  register_module("to_out.0", &to_out0_);
  if (added_kv) {
    add_q_proj_ = std::make_unique<nn::Linear>(dim, inner, true, nn::column(tp));
    add_k_proj_ = std::make_unique<nn::Linear>(dim, inner, true, nn::column(tp));
    add_v_proj_ = std::make_unique<nn::Linear>(dim, inner, true, nn::column(tp));
    register_module("add_q_proj", add_q_proj_.get());
    register_module("add_k_proj", add_k_proj_.get());
    register_module("add_v_proj", add_v_proj_.get());
    norm_added_q_ = make_qk_norm(qk_norm, head_dim);
    norm_added_k_ = make_qk_norm(qk_norm, head_dim);
    if (norm_added_q_) {
      register_module("norm_added_q", norm_added_q_.get());
      register_module("norm_added_k", norm_added_k_.get());
    }
    if (!context_pre_only) {
      to_add_out_ = std::make_unique<nn::Linear>(inner, dim, true, nn::row(tp));
      register_module("to_add_out", to_add_out_.get());
    }
  }
}

Tensor SD3Attention::heads(const nn::Linear& proj, const nn::RMSNorm* norm, const Tensor& x) const {
  const Tensor h = proj(x).view({x.size(0), x.size(1), heads_, head_dim_});
  // diffusers' RMSNorm: x * rsqrt(mean(x^2) + eps) in float32, rounded to a bf16/f16 weight's dtype, times
  // the weight (RmsNormStyle::Diffusers).
  return norm ? (*norm)(h) : h;
}

Tensor SD3Attention::attend(const Tensor& q, const Tensor& k, const Tensor& v) const {
  const int64_t batch = q.size(0), seq = q.size(1);
  // The attention works on [B, H, S, D]; the transposes are views of the [B, S, H, D] projections. Scale
  // 1/sqrt(head_dim), no mask.
  const Tensor out = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
  return out.transpose(1, 2).reshape({batch, seq, heads_ * head_dim_});
}

std::pair<Tensor, Tensor> SD3Attention::forward_joint(const Tensor& x, const Tensor& c) const {
  const Tensor q = concat({heads(to_q_, norm_q_.get(), x), heads(*add_q_proj_, norm_added_q_.get(), c)}, 1);
  const Tensor k = concat({heads(to_k_, norm_k_.get(), x), heads(*add_k_proj_, norm_added_k_.get(), c)}, 1);
  const Tensor v = concat({heads(to_v_, nullptr, x), heads(*add_v_proj_, nullptr, c)}, 1);
  const Tensor out = attend(q, k, v);
  const int64_t image = x.size(1), text = c.size(1);
  Tensor context_out;
  if (to_add_out_) context_out = (*to_add_out_)(out.narrow(1, image, text));
  return {to_out0_(out.narrow(1, 0, image)), context_out};
}

Tensor SD3Attention::forward_self(const Tensor& x) const {
  return to_out0_(
      attend(heads(to_q_, norm_q_.get(), x), heads(to_k_, norm_k_.get(), x), heads(to_v_, nullptr, x)));
}

SD3JointTransformerBlock::SD3JointTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, bool qk_norm,
                                                   bool dual_attention, bool context_pre_only,
                                                   const nn::TensorParallel& tp)
    : dual_(dual_attention),
      context_pre_only_(context_pre_only),
      norm1_(dim, dual_attention ? 9 : 6, /*bias=*/true, tp),
      attn_(dim, heads, head_dim, qk_norm, /*added_kv=*/true, context_pre_only, tp),
      ff_(dim, 4 * dim, tp) {
  register_module("norm1", &norm1_);
  if (context_pre_only) {
    norm1_context_continuous_ = std::make_unique<AdaLayerNormContinuous>(dim, /*bias=*/true, tp);
    register_module("norm1_context", norm1_context_continuous_.get());
  } else {
    norm1_context_ = std::make_unique<Modulation>(dim, 6, /*bias=*/true, tp);
    register_module("norm1_context", norm1_context_.get());
  }
  register_module("attn", &attn_);
  if (dual_attention) {
    attn2_ = std::make_unique<SD3Attention>(dim, heads, head_dim, qk_norm, /*added_kv=*/false,
                                            /*context_pre_only=*/false, tp);
    register_module("attn2", attn2_.get());
  }
  register_module("ff", &ff_);
  if (!context_pre_only) {
    ff_context_ = std::make_unique<GeluTanhFeedForward>(dim, 4 * dim, tp);
    register_module("ff_context", ff_context_.get());
  }
}

std::pair<Tensor, Tensor> SD3JointTransformerBlock::forward(const Tensor& x, const Tensor& c,
                                                            const Tensor& silu_temb) const {
  if (!is_compiled()) return forward_eager(x, c, silu_temb);
  const std::vector<Tensor> out = call_compiled(
      {x, c, silu_temb},
      [this](const auto& in) {
        const auto [x1, c1] = forward_eager(in[0], in[1], in[2]);
        return std::vector<Tensor>{x1, c1};
      },
      std::string("dual=") + (dual_ ? "1" : "0") + ",context_pre_only=" + (context_pre_only_ ? "1" : "0"));
  return {out[0], out[1]};
}

std::pair<Tensor, Tensor> SD3JointTransformerBlock::forward_eager(const Tensor& x, const Tensor& c,
                                                                  const Tensor& silu_temb) const {
  // AdaLayerNormZero chunk order; SD35AdaLayerNormZeroX appends shift_msa2, scale_msa2, gate_msa2.
  enum { kShiftMsa, kScaleMsa, kGateMsa, kShiftMlp, kScaleMlp, kGateMlp, kShiftMsa2, kScaleMsa2, kGateMsa2 };
  const std::vector<Tensor> m = norm1_.forward(silu_temb);
  const Tensor n = layer_norm_plain(x);
  const Tensor nx = modulate(n, m[kScaleMsa], m[kShiftMsa]);

  std::vector<Tensor> mc;
  Tensor nc;
  if (context_pre_only_) {
    nc = norm1_context_continuous_->forward(c, silu_temb);
  } else {
    mc = norm1_context_->forward(silu_temb);
    nc = modulate(layer_norm_plain(c), mc[kScaleMsa], mc[kShiftMsa]);
  }
  const auto [attn_x, attn_c] = attn_.forward_joint(nx, nc);

  Tensor x1 = gated_residual(x, m[kGateMsa], attn_x);
  if (dual_) {
    // attn2 reads the same normalised input as attn, modulated by the second (shift, scale) pair.
    const Tensor nx2 = modulate(n, m[kScaleMsa2], m[kShiftMsa2]);
    x1 = gated_residual(x1, m[kGateMsa2], attn2_->forward_self(nx2));
  }
  x1 = gated_residual(x1, m[kGateMlp],
                      ff_.forward(modulate(layer_norm_plain(x1), m[kScaleMlp], m[kShiftMlp])));
  if (context_pre_only_) return {x1, c};

  Tensor c1 = gated_residual(c, mc[kGateMsa], attn_c);
  c1 = gated_residual(c1, mc[kGateMlp],
                      ff_context_->forward(modulate(layer_norm_plain(c1), mc[kScaleMlp], mc[kShiftMlp])));
  return {x1, c1};
}

}  // namespace kiln::models
