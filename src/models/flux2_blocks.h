// The blocks of Flux2Transformer2DModel with diffusers' parameter names: the time/guidance embedding, the
// SwiGLU feed-forward (Flux2FeedForward), the double-stream Flux2TransformerBlock (FluxAttention without
// biases) and the single-stream Flux2SingleTransformerBlock (Flux2ParallelSelfAttention: fused
// to_qkv_mlp_proj and to_out).
//
// The blocks read the shared modulations as the raw projections ([B, 6D] for the double-stream image and text
// streams, [B, 3D] for the single stream) and split them themselves, as diffusers' blocks do, so a compiled
// block program takes the same inputs in every block.
//
// Tensor-parallel plan (diffusers' Flux2Transformer2DModel._tp_plan): attention projections into heads
// column-parallel, out of heads row-parallel; the SwiGLU linear_in column-parallel over its two halves (gate
// and up split separately, so each rank holds matching halves) and linear_out row-parallel; the single
// block's to_qkv_mlp_proj column-parallel over its five blocks [q | k | v | gate | up] and to_out
// row-parallel over [attention | mlp]; the modulations stay whole (gathered).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "kiln/nn/layers.h"
#include "models/dit_layers.h"
#include "models/flux_blocks.h"
#include "models/flux_embeddings.h"

namespace kiln::models {

// Flux2TimestepGuidanceEmbeddings: timestep_embedder(proj(t)) [+ guidance_embedder(proj(g))], where proj is
// the sinusoid cast to t's (g's) dtype; t and g are already scaled by 1000. No biases.
class Flux2TimeGuidanceEmbedding : public nn::Module {
 public:
  Flux2TimeGuidanceEmbedding(int64_t channels, int64_t dim, bool guidance_embeds,
                             const nn::TensorParallel& tp = {});
  // `guidance` may be undefined; it is ignored by a model without a guidance embedding (as in diffusers).
  Tensor forward(const Tensor& timestep, const Tensor& guidance) const;

 private:
  int64_t channels_;
  FluxMlpEmbedding timestep_embedder_;
  std::unique_ptr<FluxMlpEmbedding> guidance_embedder_;
};

// Flux2FeedForward: linear_out(silu(a) * b) where [a | b] = linear_in(x) (gate half first).
class Flux2FeedForward : public nn::Module {
 public:
  Flux2FeedForward(int64_t dim, int64_t hidden, const nn::TensorParallel& tp = {});
  Tensor forward(const Tensor& x) const;

 private:
  nn::Linear linear_in_, linear_out_;
};

// Flux2SwiGLU on the last dimension: silu(x[..., :half]) * x[..., half:].
Tensor swiglu(const Tensor& x);

// Flux2TransformerBlock: image x [B, N, D] and text c [B, L, D], modulated by the shared mod_img / mod_txt
// [B, 6D] (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp), attended jointly text first.
class Flux2TransformerBlock : public nn::Module {
 public:
  // `eps`: the config's, for the LayerNorms and the QK RMSNorms.
  Flux2TransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, int64_t mlp_hidden, double eps,
                        const nn::TensorParallel& tp = {});
  // Returns {x, c}; through the compiled cache when compiled (compile_repeated_blocks).
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& mod_img,
                                    const Tensor& mod_txt, const FluxRopeTables& rope) const;
  bool supports_compile() const override { return true; }
  // TaylorSeer (kiln/nn/step_cache.h): the step cache that may forecast attn's (image, text) outputs, as
  // diffusers hooks transformer_blocks.N.attn; null: none.
  void use_step_cache(nn::StepCache* cache) { attn_.use_step_cache(cache); }

 private:
  std::pair<Tensor, Tensor> forward_eager(const Tensor& x, const Tensor& c, const Tensor& mod_img,
                                          const Tensor& mod_txt, const FluxRopeTables& rope) const;
  double eps_;
  FluxAttention attn_;
  Flux2FeedForward ff_, ff_context_;
};

// Flux2SingleTransformerBlock over the joint sequence s = [text; image] [B, L + N, D], modulated by the
// shared mod_single [B, 3D] (shift, scale, gate).
class Flux2SingleTransformerBlock : public nn::Module {
 public:
  Flux2SingleTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, int64_t mlp_hidden, double eps,
                              const nn::TensorParallel& tp = {});
  Tensor forward(const Tensor& s, const Tensor& mod_single, const FluxRopeTables& rope) const;
  bool supports_compile() const override { return true; }
  // TaylorSeer (kiln/nn/step_cache.h): the step cache that may forecast what diffusers' attn
  // (Flux2ParallelSelfAttention, hooked as single_transformer_blocks.N.attn) returns: to_out of the attention
  // and the MLP, before the gate; null: none.
  void use_step_cache(nn::StepCache* cache) { step_cache_ = cache; }

 private:
  Tensor forward_eager(const Tensor& s, const Tensor& mod_single, const FluxRopeTables& rope) const;
  // diffusers' attn: [q | k | v | gate | up] from the modulated input, attention and SwiGLU, then to_out.
  Tensor parallel_attention(const Tensor& n, const FluxRopeTables& rope) const;
  int64_t heads_, head_dim_, mlp_hidden_;  // this rank's heads and MLP width
  double eps_;
  nn::StepCache* step_cache_ = nullptr;
  nn::RMSNorm norm_q_, norm_k_;
  nn::Linear to_qkv_mlp_proj_, to_out_;
};

}  // namespace kiln::models
