#include "families/qwen_image/qwen_image_blocks.h"

#include <cmath>

#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"

namespace kiln::models {

namespace {

constexpr int64_t kTimestepChannels = 256;  // Timesteps(num_channels=256)
constexpr double kTimestepScale = 1000.0;   // Timesteps(scale=1000)
constexpr double kNormEps = 1e-6;           // the blocks' LayerNorms and QK RMSNorms

}  // namespace

QwenTimestepEmbedding::QwenTimestepEmbedding(int64_t dim, const nn::TensorParallel& tp)
    : timestep_embedder_(kTimestepChannels, dim, tp) {
  register_module("timestep_embedder", &timestep_embedder_);
}

Tensor QwenTimestepEmbedding::forward(const Tensor& t) const {
  const int64_t half = kTimestepChannels / 2;
  // exponent = -log(10000) * arange(half) / half and its exp, each a float32 op as torch does them.
  const float neg_log_period = static_cast<float>(-std::log(10000.0));
  std::vector<float> freqs(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    freqs[static_cast<size_t>(i)] =
        std::exp(static_cast<float>(i) * neg_log_period / static_cast<float>(half));
  // Timesteps uses embeddings.get_timestep_embedding (not the copy in transformer_qwenimage.py, which would
  // round the frequencies to the timestep's dtype): float32 frequencies, the scale applied after the product.
  const Tensor f = Tensor::from_vector(freqs, {1, half}).to(t.device());
  const Tensor args = mul(mul(t.to(float32).unsqueeze(1), f), kTimestepScale);
  return timestep_embedder_.forward(concat({cos(args), sin(args)}, 1).to(t.dtype()));
}

QwenImageAttention::QwenImageAttention(int64_t dim, int64_t heads, int64_t head_dim,
                                       const nn::TensorParallel& tp)
    : heads_(tp.split(heads, "QwenImageTransformer2DModel num_attention_heads")),
      head_dim_(head_dim),
      to_q_(dim, heads * head_dim, true, nn::column(tp)),
      to_k_(dim, heads * head_dim, true, nn::column(tp)),
      to_v_(dim, heads * head_dim, true, nn::column(tp)),
      add_q_proj_(dim, heads * head_dim, true, nn::column(tp)),
      add_k_proj_(dim, heads * head_dim, true, nn::column(tp)),
      add_v_proj_(dim, heads * head_dim, true, nn::column(tp)),
      to_out_(heads * head_dim, dim, true, nn::row(tp)),
      to_add_out_(heads * head_dim, dim, true, nn::row(tp)),
      // Attention(qk_norm="rms_norm") builds diffusers' RMSNorm, not torch.nn.RMSNorm as FLUX's attention.
      norm_q_(head_dim, kNormEps),
      norm_k_(head_dim, kNormEps),
      norm_added_q_(head_dim, kNormEps),
      norm_added_k_(head_dim, kNormEps) {
  register_module("norm_q", &norm_q_);
  register_module("norm_k", &norm_k_);
  register_module("to_q", &to_q_);
  register_module("to_k", &to_k_);
  register_module("to_v", &to_v_);
  register_module("add_q_proj", &add_q_proj_);
  register_module("add_k_proj", &add_k_proj_);
  register_module("add_v_proj", &add_v_proj_);
  register_module("to_out.0", &to_out_);  // to_out.1 is a parameterless Dropout
  register_module("to_add_out", &to_add_out_);
  register_module("norm_added_q", &norm_added_q_);
  register_module("norm_added_k", &norm_added_k_);
}

Tensor QwenImageAttention::heads(const nn::Linear& proj, const Tensor& x, const nn::RMSNorm* norm) const {
  const Tensor h = proj(x).view({x.size(0), x.size(1), heads_, head_dim_});
  return norm != nullptr ? (*norm)(h) : h;
}

std::pair<Tensor, Tensor> QwenImageAttention::forward(const Tensor& x, const Tensor& c, const Tensor& cos,
                                                      const Tensor& sin, const Tensor& mask) const {
  if (step_cache_ == nullptr || !step_cache_->forecasts_modules()) return joint(x, c, cos, sin, mask);
  const std::vector<Tensor> out = step_cache_->module_outputs(this, [&] {
    const auto [image, text] = joint(x, c, cos, sin, mask);
    return std::vector<Tensor>{image, text};
  });
  return {out[0], out[1]};
}

std::pair<Tensor, Tensor> QwenImageAttention::joint(const Tensor& x, const Tensor& c, const Tensor& cos,
                                                    const Tensor& sin, const Tensor& mask) const {
  // diffusers rotates each stream with its own table and concatenates [text, image]; rotating the
  // concatenation with the concatenated tables gives the same values.
  const Tensor q = concat({heads(add_q_proj_, c, &norm_added_q_), heads(to_q_, x, &norm_q_)}, 1);
  const Tensor k = concat({heads(add_k_proj_, c, &norm_added_k_), heads(to_k_, x, &norm_k_)}, 1);
  const Tensor v = concat({heads(add_v_proj_, c), heads(to_v_, x)}, 1);
  const Tensor out = rope_attention(q, k, v, cos, sin, mask);
  const int64_t text = c.size(1), image = x.size(1);
  return {to_out_(out.narrow(1, text, image)), to_add_out_(out.narrow(1, 0, text))};
}

QwenImageTransformerBlock::QwenImageTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim,
                                                     const nn::TensorParallel& tp)
    // diffusers keeps the modulations replicated; column-parallel and gathered gives the same [B, 6 * dim]
    // with a rank's share of their large weights.
    : img_mod_(dim, 6 * dim, true, nn::column_gathered(tp)),
      txt_mod_(dim, 6 * dim, true, nn::column_gathered(tp)),
      attn_(dim, heads, head_dim, tp),
      img_mlp_(dim, 4 * dim, tp),
      txt_mlp_(dim, 4 * dim, tp) {
  register_module("img_mod.1", &img_mod_);  // img_mod.0 is the parameterless SiLU
  register_module("attn", &attn_);
  register_module("img_mlp", &img_mlp_);
  register_module("txt_mod.1", &txt_mod_);
  register_module("txt_mlp", &txt_mlp_);
}

std::pair<Tensor, Tensor> QwenImageTransformerBlock::forward(const Tensor& x, const Tensor& c,
                                                             const Tensor& silu_temb, const Tensor& cos,
                                                             const Tensor& sin, const Tensor& mask,
                                                             const Tensor& reference) const {
  if (!is_compiled()) return forward_eager(x, c, silu_temb, cos, sin, mask, reference);
  // The traced graph differs with a mask and with zero_cond_t: each is its own program.
  std::vector<Tensor> inputs{x, c, silu_temb, cos, sin, mask, reference};
  std::erase_if(inputs, [](const Tensor& t) { return !t.defined(); });
  const bool masked = mask.defined(), zero_cond = reference.defined();
  const std::vector<Tensor> out = call_compiled(
      inputs,
      [this, masked, zero_cond](const auto& in) {
        const Tensor m = masked ? in[5] : Tensor();
        const Tensor r = zero_cond ? in[masked ? 6 : 5] : Tensor();
        const auto [x1, c1] = forward_eager(in[0], in[1], in[2], in[3], in[4], m, r);
        return std::vector<Tensor>{x1, c1};
      },
      std::string(masked ? "masked" : "") + (zero_cond ? "zero_cond" : ""));
  return {out[0], out[1]};
}

std::pair<Tensor, Tensor> QwenImageTransformerBlock::forward_eager(const Tensor& x, const Tensor& c,
                                                                   const Tensor& silu_temb, const Tensor& cos,
                                                                   const Tensor& sin, const Tensor& mask,
                                                                   const Tensor& reference) const {
  enum { kShiftMsa, kScaleMsa, kGateMsa, kShiftMlp, kScaleMlp, kGateMlp };
  const int64_t batch = x.size(0);
  // The image's chunks per token, [B, 1, D] (or [B, L, D] under zero_cond_t: the t = 0 rows where
  // `reference`), applied as diffusers' _modulate: x * (1 + scale) + shift, and x + gate * y.
  std::vector<Tensor> m = chunk(img_mod_(silu_temb), 6, 1);
  for (Tensor& p : m) {
    p = reference.defined()
            ? where(reference, p.narrow(0, batch, batch).unsqueeze(1), p.narrow(0, 0, batch).unsqueeze(1))
            : p.unsqueeze(1);
  }
  const auto modulate_image = [&](const Tensor& normed, int scale, int shift) {
    return add(mul(normed, add(1.0, m[static_cast<size_t>(scale)])), m[static_cast<size_t>(shift)]);
  };
  const auto gate_image = [&](const Tensor& residual, int gate, const Tensor& y) {
    return add(residual, mul(m[static_cast<size_t>(gate)], y));
  };
  // The text takes t's rows alone.
  const std::vector<Tensor> mc = chunk(txt_mod_(silu_temb.narrow(0, 0, batch)), 6, 1);
  const auto [attn_x, attn_c] =
      attn_.forward(modulate_image(layer_norm_plain(x, kNormEps), kScaleMsa, kShiftMsa),
                    modulate(layer_norm_plain(c, kNormEps), mc[kScaleMsa], mc[kShiftMsa]), cos, sin, mask);
  Tensor x1 = gate_image(x, kGateMsa, attn_x);
  Tensor c1 = gated_residual(c, mc[kGateMsa], attn_c);
  x1 = gate_image(x1, kGateMlp,
                  img_mlp_.forward(modulate_image(layer_norm_plain(x1, kNormEps), kScaleMlp, kShiftMlp)));
  c1 = gated_residual(
      c1, mc[kGateMlp],
      txt_mlp_.forward(modulate(layer_norm_plain(c1, kNormEps), mc[kScaleMlp], mc[kShiftMlp])));
  return {clip_if_float16(x1), clip_if_float16(c1)};
}

}  // namespace kiln::models
