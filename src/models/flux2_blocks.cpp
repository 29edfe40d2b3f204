#include "models/flux2_blocks.h"

#include <vector>

#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"

namespace kiln::models {

Flux2TimeGuidanceEmbedding::Flux2TimeGuidanceEmbedding(int64_t channels, int64_t dim, bool guidance_embeds,
                                                       const nn::TensorParallel& tp)
    : channels_(channels), timestep_embedder_(channels, dim, tp, /*bias=*/false) {
  register_module("timestep_embedder", &timestep_embedder_);
  if (guidance_embeds) {
    guidance_embedder_ = std::make_unique<FluxMlpEmbedding>(channels, dim, tp, /*bias=*/false);
    register_module("guidance_embedder", guidance_embedder_.get());
  }
}

Tensor Flux2TimeGuidanceEmbedding::forward(const Tensor& timestep, const Tensor& guidance) const {
  // time_proj(t) is float32; diffusers casts it to the timestep's dtype (the model's) before linear_1.
  const Tensor temb =
      timestep_embedder_.forward(flux_timestep_sinusoid(timestep, channels_).to(timestep.dtype()));
  if (!guidance.defined() || !guidance_embedder_) return temb;
  return add(temb,
             guidance_embedder_->forward(flux_timestep_sinusoid(guidance, channels_).to(guidance.dtype())));
}

Tensor swiglu(const Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return mul(silu(x.narrow(-1, 0, half)), x.narrow(-1, half, half));
}

Flux2FeedForward::Flux2FeedForward(int64_t dim, int64_t hidden, const nn::TensorParallel& tp)
    : linear_in_(dim, 2 * hidden, false, nn::column(tp, {hidden, hidden})),
      linear_out_(hidden, dim, false, nn::row(tp)) {
  register_module("linear_in", &linear_in_);
  register_module("linear_out", &linear_out_);
}

Tensor Flux2FeedForward::forward(const Tensor& x) const {
  return linear_out_(swiglu(linear_in_(x)));
}

Flux2TransformerBlock::Flux2TransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, int64_t mlp_hidden,
                                             double eps, const nn::TensorParallel& tp)
    : eps_(eps),
      attn_(dim, heads, head_dim, /*added_kv=*/true, /*pre_only=*/false, tp, /*bias=*/false, eps),
      ff_(dim, mlp_hidden, tp),
      ff_context_(dim, mlp_hidden, tp) {
  // norm1, norm2, norm1_context and norm2_context are parameterless LayerNorms: nothing to register.
  register_module("attn", &attn_);
  register_module("ff", &ff_);
  register_module("ff_context", &ff_context_);
}

std::pair<Tensor, Tensor> Flux2TransformerBlock::forward(const Tensor& x, const Tensor& c,
                                                         const Tensor& mod_img, const Tensor& mod_txt,
                                                         const FluxRopeTables& rope) const {
  if (!is_compiled()) return forward_eager(x, c, mod_img, mod_txt, rope);
  const std::vector<Tensor> out =
      call_compiled({x, c, mod_img, mod_txt, rope.cos, rope.sin}, [this](const auto& in) {
        const auto [x1, c1] = forward_eager(in[0], in[1], in[2], in[3], FluxRopeTables{in[4], in[5]});
        return std::vector<Tensor>{x1, c1};
      });
  return {out[0], out[1]};
}

std::pair<Tensor, Tensor> Flux2TransformerBlock::forward_eager(const Tensor& x, const Tensor& c,
                                                               const Tensor& mod_img, const Tensor& mod_txt,
                                                               const FluxRopeTables& rope) const {
  // Flux2Modulation.split(mod, 2): shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp.
  enum { kShiftMsa, kScaleMsa, kGateMsa, kShiftMlp, kScaleMlp, kGateMlp };
  const std::vector<Tensor> m = chunk(mod_img, 6, 1);
  const std::vector<Tensor> mc = chunk(mod_txt, 6, 1);
  const Tensor nx = modulate(layer_norm_plain(x, eps_), m[kScaleMsa], m[kShiftMsa]);
  const Tensor nc = modulate(layer_norm_plain(c, eps_), mc[kScaleMsa], mc[kShiftMsa]);
  const auto [attn_x, attn_c] = attn_.forward_joint(nx, nc, rope);

  Tensor x1 = gated_residual(x, m[kGateMsa], attn_x);
  x1 = gated_residual(x1, m[kGateMlp],
                      ff_.forward(modulate(layer_norm_plain(x1, eps_), m[kScaleMlp], m[kShiftMlp])));

  Tensor c1 = gated_residual(c, mc[kGateMsa], attn_c);
  c1 =
      gated_residual(c1, mc[kGateMlp],
                     ff_context_.forward(modulate(layer_norm_plain(c1, eps_), mc[kScaleMlp], mc[kShiftMlp])));
  // diffusers clips only the text stream in this block.
  return {x1, clip_if_float16(c1)};
}

Flux2SingleTransformerBlock::Flux2SingleTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim,
                                                         int64_t mlp_hidden, double eps,
                                                         const nn::TensorParallel& tp)
    : heads_(tp.split(heads, "Flux2Transformer2DModel num_attention_heads")),
      head_dim_(head_dim),
      mlp_hidden_(tp.split(mlp_hidden, "Flux2Transformer2DModel MLP width")),
      eps_(eps),
      // torch.nn.RMSNorm: the weight multiplies in float32 and the result is rounded once to x's dtype.
      norm_q_(head_dim, eps, true, RmsNormStyle::Torch),
      norm_k_(head_dim, eps, true, RmsNormStyle::Torch),
      to_qkv_mlp_proj_(
          dim, 3 * heads * head_dim + 2 * mlp_hidden, false,
          nn::column(tp, {heads * head_dim, heads * head_dim, heads * head_dim, mlp_hidden, mlp_hidden})),
      to_out_(heads * head_dim + mlp_hidden, dim, false, nn::row(tp, {heads * head_dim, mlp_hidden})) {
  // The block's LayerNorm is parameterless; the projections and QK norms live under attn.
  register_module("attn.to_qkv_mlp_proj", &to_qkv_mlp_proj_);
  register_module("attn.norm_q", &norm_q_);
  register_module("attn.norm_k", &norm_k_);
  register_module("attn.to_out", &to_out_);
}

Tensor Flux2SingleTransformerBlock::forward(const Tensor& s, const Tensor& mod_single,
                                            const FluxRopeTables& rope) const {
  if (!is_compiled()) return forward_eager(s, mod_single, rope);
  return call_compiled({s, mod_single, rope.cos, rope.sin}, [this](const auto& in) {
    return std::vector<Tensor>{forward_eager(in[0], in[1], FluxRopeTables{in[2], in[3]})};
  })[0];
}

Tensor Flux2SingleTransformerBlock::forward_eager(const Tensor& s, const Tensor& mod_single,
                                                  const FluxRopeTables& rope) const {
  // Flux2Modulation.split(mod, 1): shift, scale, gate.
  const std::vector<Tensor> m = chunk(mod_single, 3, 1);
  const Tensor n = modulate(layer_norm_plain(s, eps_), m[1], m[0]);
  const Tensor out = step_cache_ == nullptr || !step_cache_->forecasts_modules()
                         ? parallel_attention(n, rope)
                         : step_cache_->module_outputs(
                               this, [&] { return std::vector<Tensor>{parallel_attention(n, rope)}; })[0];
  return clip_if_float16(gated_residual(s, m[2], out));
}

Tensor Flux2SingleTransformerBlock::parallel_attention(const Tensor& n, const FluxRopeTables& rope) const {
  // [q | k | v | gate | up] (this rank's slices of each, in that order).
  const Tensor p = to_qkv_mlp_proj_(n);
  const int64_t batch = n.size(0), seq = n.size(1), inner = heads_ * head_dim_;
  auto heads = [&](int64_t i) { return p.narrow(2, i * inner, inner).view({batch, seq, heads_, head_dim_}); };
  const Tensor attn = rope_attention(norm_q_(heads(0)), norm_k_(heads(1)), heads(2), rope.cos, rope.sin);
  const Tensor mlp = swiglu(p.narrow(2, 3 * inner, 2 * mlp_hidden_));
  // to_out reads [attention | mlp] along the features.
  return to_out_(concat({attn, mlp}, 2));
}

}  // namespace kiln::models
