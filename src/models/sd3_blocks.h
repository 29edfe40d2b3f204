// The blocks of SD3Transformer2DModel with diffusers' parameter names: the joint attention of the MMDiT
// (Attention + JointAttnProcessor2_0, optionally with per-head QK RMSNorm), the image-only attn2 of the
// MMDiT-X blocks, and JointTransformerBlock with its AdaLayerNormZero / SD35AdaLayerNormZeroX /
// AdaLayerNormContinuous modulations. The modulations, feed-forward and continuous norm are the DiT layers
// FLUX shares (models/dit_layers.h: same names and math).
//
// Blocks take silu(temb): every adaptive norm computes linear(silu(temb)) from the same temb, so the SiLU is
// computed once per forward (identical values).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "kiln/nn/layers.h"
#include "models/dit_layers.h"

namespace kiln::models {

// diffusers' Attention as SD3 builds it: to_q/to_k/to_v/to_out.0 with bias, optional norm_q/norm_k (diffusers
// RMSNorm over the head dim, eps 1e-6) and, with added projections, the context stream's add_q/k/v_proj,
// norm_added_q/k and (unless context_pre_only) to_add_out.
class SD3Attention : public nn::Module {
 public:
  // Tensor parallelism as FluxAttention: projections into heads column-, out of heads row-parallel.
  SD3Attention(int64_t dim, int64_t heads, int64_t head_dim, bool qk_norm, bool added_kv,
               bool context_pre_only, const nn::TensorParallel& tp = {});
  // Joint attention over [image; context] (image tokens first, as JointAttnProcessor2_0 concatenates).
  // Returns {image out, context out}; the context output is undefined when context_pre_only.
  std::pair<Tensor, Tensor> forward_joint(const Tensor& x, const Tensor& c) const;
  // Self-attention of one stream (attn2 of the dual-attention blocks), through to_out.0.
  Tensor forward_self(const Tensor& x) const;

 private:
  // [B, S, H, D] head-split projection, RMS-normed per head when a norm is given.
  Tensor heads(const nn::Linear& proj, const nn::RMSNorm* norm, const Tensor& x) const;
  // Attention of q, k, v [B, S, H, D] -> [B, S, H * D].
  Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v) const;

  int64_t heads_, head_dim_;
  nn::Linear to_q_, to_k_, to_v_, to_out0_;
  std::unique_ptr<nn::RMSNorm> norm_q_, norm_k_, norm_added_q_, norm_added_k_;
  std::unique_ptr<nn::Linear> add_q_proj_, add_k_proj_, add_v_proj_, to_add_out_;
};

// JointTransformerBlock. `dual_attention` selects SD35AdaLayerNormZeroX (9 modulation chunks) and attn2;
// `context_pre_only` (the last block) gives norm1_context an AdaLayerNormContinuous and drops the context
// stream's output projection, norm2_context and ff_context.
class SD3JointTransformerBlock : public nn::Module {
 public:
  SD3JointTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, bool qk_norm, bool dual_attention,
                           bool context_pre_only, const nn::TensorParallel& tp = {});
  // Returns {x, c} after the block; c is returned unchanged by a context_pre_only block (diffusers returns
  // None there, and nothing reads it).
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& silu_temb) const;
  bool supports_compile() const override { return true; }

 private:
  std::pair<Tensor, Tensor> forward_eager(const Tensor& x, const Tensor& c, const Tensor& silu_temb) const;
  bool dual_, context_pre_only_;
  Modulation norm1_;
  std::unique_ptr<Modulation> norm1_context_;
  std::unique_ptr<AdaLayerNormContinuous> norm1_context_continuous_;
  SD3Attention attn_;
  std::unique_ptr<SD3Attention> attn2_;
  GeluTanhFeedForward ff_;
  std::unique_ptr<GeluTanhFeedForward> ff_context_;
};

}  // namespace kiln::models
