// The blocks of FluxTransformer2DModel with diffusers' parameter names: the joint attention (FluxAttention +
// FluxAttnProcessor, also FLUX.2's Flux2Attention), the double-stream FluxTransformerBlock and the
// single-stream FluxSingleTransformerBlock. The modulations, norms and feed-forward they use are the shared
// DiT layers (models/dit_layers.h); every block takes silu(temb), computed once per forward.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kiln/nn/layers.h"
#include "kiln/nn/step_cache.h"
#include "models/dit_layers.h"
#include "models/flux_embeddings.h"

namespace kiln::models {

// FluxAttention. With added projections (double-stream blocks) the text stream gets its own q/k/v, QK norms
// and output projection; without them and pre_only (single-stream blocks) there is no output projection.
class FluxAttention : public nn::Module {
 public:
  // Under tensor parallelism this rank holds heads / tp.size heads (an error names the model's head count
  // when it does not divide). `bias`: FLUX.1's projections have biases, FLUX.2's have none; `eps` is the QK
  // norms' (1e-6 in both generations; FLUX.2 reads it from its config).
  FluxAttention(int64_t dim, int64_t heads, int64_t head_dim, bool added_kv, bool pre_only,
                const nn::TensorParallel& tp = {}, bool bias = true, double eps = 1e-6);
  // Joint attention of the text stream (first) and the image stream; returns {image out, text out}.
  // `bias` (optional): added to the scores, broadcastable to [B, heads, S, S] over the joint sequence
  // (Chroma's padding mask).
  std::pair<Tensor, Tensor> forward_joint(const Tensor& x, const Tensor& c, const FluxRopeTables& rope,
                                          const Tensor& bias = {}) const;
  // Self-attention over one stream (the single-stream blocks); returns [B, S, heads * head_dim], no
  // projection.
  Tensor forward_self(const Tensor& s, const FluxRopeTables& rope, const Tensor& bias = {}) const;
  // TaylorSeer (kiln/nn/step_cache.h): the step cache that may forecast this attention's outputs, as
  // diffusers' hook on `...blocks.N.attn` does; null (the default): none.
  void use_step_cache(nn::StepCache* cache) { step_cache_ = cache; }

 private:
  std::pair<Tensor, Tensor> joint(const Tensor& x, const Tensor& c, const FluxRopeTables& rope,
                                  const Tensor& bias) const;
  Tensor self(const Tensor& s, const FluxRopeTables& rope, const Tensor& bias) const;
  nn::StepCache* step_cache_ = nullptr;
  // [B, S, H, D] head-split q or k after the projection, QK-normed (torch.nn.RMSNorm).
  Tensor heads_normed(const nn::Linear& proj, const nn::RMSNorm& norm, const Tensor& x) const;
  Tensor heads(const nn::Linear& proj, const Tensor& x) const;

  int64_t heads_, head_dim_;
  nn::RMSNorm norm_q_, norm_k_;
  nn::Linear to_q_, to_k_, to_v_;
  std::unique_ptr<nn::Linear> to_out0_;  // to_out.0 (to_out.1 is a parameterless Dropout)
  std::unique_ptr<nn::RMSNorm> norm_added_q_, norm_added_k_;
  std::unique_ptr<nn::Linear> add_q_proj_, add_k_proj_, add_v_proj_, to_add_out_;
};

// The arithmetic of the two block kinds around their attention and feed-forwards, given their modulation
// chunks ([B, D] each, in AdaLayerNormZero's order: shift, scale, gate of the attention, then of the MLP; the
// single-stream block has the first three). FLUX.1's blocks project their chunks from temb; Chroma's
// approximator makes every block's at once. `bias` as FluxAttention's.
std::pair<Tensor, Tensor> double_stream_block(const FluxAttention& attn, const GeluTanhFeedForward& ff,
                                              const GeluTanhFeedForward& ff_context, const Tensor& x,
                                              const Tensor& c, const std::vector<Tensor>& image_chunks,
                                              const std::vector<Tensor>& text_chunks,
                                              const FluxRopeTables& rope, const Tensor& bias = {});
Tensor single_stream_block(const FluxAttention& attn, const nn::Linear& proj_mlp, const nn::Linear& proj_out,
                           const Tensor& s, const std::vector<Tensor>& chunks, const FluxRopeTables& rope,
                           const Tensor& bias = {});

// Double-stream block: image x [B, N, D] and text c [B, L, D] modulated separately, attended jointly.
class FluxTransformerBlock : public nn::Module {
 public:
  FluxTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, const nn::TensorParallel& tp = {});
  // Returns {x, c} after the block; through the compiled cache when compiled (compile_repeated_blocks).
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& silu_temb,
                                    const FluxRopeTables& rope) const;
  bool supports_compile() const override { return true; }
  void use_step_cache(nn::StepCache* cache) { attn_.use_step_cache(cache); }

 private:
  std::pair<Tensor, Tensor> forward_eager(const Tensor& x, const Tensor& c, const Tensor& silu_temb,
                                          const FluxRopeTables& rope) const;
  Modulation norm1_, norm1_context_;
  FluxAttention attn_;
  GeluTanhFeedForward ff_, ff_context_;
};

// Single-stream block over the joint sequence s = [text; image] [B, L + N, D].
class FluxSingleTransformerBlock : public nn::Module {
 public:
  // Tensor parallelism: to_q/k/v and proj_mlp column-parallel, so the rank's [attention | mlp] input to
  // proj_out holds its heads and its mlp slice; proj_out is row-parallel over those two blocks.
  FluxSingleTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, int64_t mlp_hidden,
                             const nn::TensorParallel& tp = {});
  Tensor forward(const Tensor& s, const Tensor& silu_temb, const FluxRopeTables& rope) const;
  bool supports_compile() const override { return true; }
  void use_step_cache(nn::StepCache* cache) { attn_.use_step_cache(cache); }

 private:
  Tensor forward_eager(const Tensor& s, const Tensor& silu_temb, const FluxRopeTables& rope) const;
  Modulation norm_;
  nn::Linear proj_mlp_, proj_out_;
  FluxAttention attn_;
};

}  // namespace kiln::models
