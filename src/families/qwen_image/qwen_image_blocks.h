// The blocks of QwenImageTransformer2DModel (diffusers' transformer_qwenimage.py) with diffusers' parameter
// names: the timestep embedding (QwenTimestepProjEmbeddings), the joint attention of the two streams
// (Attention with added_kv_proj_dim and QwenDoubleStreamAttnProcessor2_0) and the dual-stream block
// (QwenImageTransformerBlock). The LayerNorms, modulation arithmetic and GELU-tanh feed-forwards are the
// shared DiT layers (models/dit_layers.h); every block takes silu(temb), computed once per forward.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/nn/layers.h"
#include "kiln/nn/step_cache.h"
#include "models/dit_layers.h"
#include "models/flux_embeddings.h"

namespace kiln::models {

// QwenTimestepProjEmbeddings(use_additional_t_cond=False): timestep_embedder(time_proj(t)), where time_proj
// is Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0, scale=1000).
class QwenTimestepEmbedding : public nn::Module {
 public:
  explicit QwenTimestepEmbedding(int64_t dim, const nn::TensorParallel& tp = {});
  // t [B] already in the compute dtype (t / 1000 as the pipeline passes it) -> temb [B, dim] in that dtype.
  // The sinusoid is [cos, sin] of 1000 * (t * f) in float32 (the scale after the product), cast to the
  // compute dtype.
  Tensor forward(const Tensor& t) const;

 private:
  FluxMlpEmbedding timestep_embedder_;
};

// The joint attention of one block: to_q/to_k/to_v on the image stream, add_q_proj/add_k_proj/add_v_proj on
// the text stream, diffusers' RMSNorm (eps 1e-6) over each head of q and k of both, RoPE, one scaled
// dot-product attention over [text | image], then to_out.0 (image) and to_add_out (text).
class QwenImageAttention : public nn::Module {
 public:
  // Under tensor parallelism this rank holds heads / tp.size heads (the q/k/v projections column-parallel,
  // to_out.0 and to_add_out row-parallel).
  QwenImageAttention(int64_t dim, int64_t heads, int64_t head_dim, const nn::TensorParallel& tp = {});
  // x [B, L, dim] (image), c [B, S, dim] (text); cos/sin [S + L, head_dim] float32, text first; `mask`
  // (optional) bool [B, 1, 1, S + L], true for the keys that take part. Returns {image out, text out}.
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& cos, const Tensor& sin,
                                    const Tensor& mask) const;
  // TaylorSeer (kiln/nn/step_cache.h): the step cache that may forecast this attention's outputs; null: none.
  void use_step_cache(nn::StepCache* cache) { step_cache_ = cache; }

 private:
  std::pair<Tensor, Tensor> joint(const Tensor& x, const Tensor& c, const Tensor& cos, const Tensor& sin,
                                  const Tensor& mask) const;
  // [B, S, H, D]: the projection split into this rank's heads, normed when `norm` is given.
  Tensor heads(const nn::Linear& proj, const Tensor& x, const nn::RMSNorm* norm = nullptr) const;

  nn::StepCache* step_cache_ = nullptr;
  int64_t heads_, head_dim_;
  nn::Linear to_q_, to_k_, to_v_, add_q_proj_, add_k_proj_, add_v_proj_, to_out_, to_add_out_;
  nn::RMSNorm norm_q_, norm_k_, norm_added_q_, norm_added_k_;
};

// QwenImageTransformerBlock. Each stream s (img, txt) has s_mod.1 = Linear(dim, 6 * dim)
// of silu(temb), chunked as shift, scale, gate of the attention then of the MLP;
//   s += gate1 * attention_s(LayerNorm(s) * (1 + scale1) + shift1)
//   s += gate2 * s_mlp(LayerNorm(s) * (1 + scale2) + shift2)
// with one joint attention for both streams; float16 streams are clipped to its range after the block.
// zero_cond_t (Qwen-Image-Edit-2511): silu_temb holds 2B rows, those of t then those of t = 0; the text and
// the image tokens outside `reference` take the first B, the `reference` tokens (the input images) the rest.
class QwenImageTransformerBlock : public nn::Module {
 public:
  QwenImageTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, const nn::TensorParallel& tp = {});
  // Returns {x, c} after the block; through the compiled cache when compiled (compile_repeated_blocks).
  // cos/sin and mask as QwenImageAttention's; silu_temb [B, dim], or [2B, dim] with `reference` bool [1, L,
  // 1] (zero_cond_t; undefined otherwise).
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& silu_temb,
                                    const Tensor& cos, const Tensor& sin, const Tensor& mask,
                                    const Tensor& reference = {}) const;
  bool supports_compile() const override { return true; }
  void use_step_cache(nn::StepCache* cache) { attn_.use_step_cache(cache); }

 private:
  std::pair<Tensor, Tensor> forward_eager(const Tensor& x, const Tensor& c, const Tensor& silu_temb,
                                          const Tensor& cos, const Tensor& sin, const Tensor& mask,
                                          const Tensor& reference) const;
  nn::Linear img_mod_, txt_mod_;
  QwenImageAttention attn_;
  GeluTanhFeedForward img_mlp_, txt_mlp_;
};

}  // namespace kiln::models
