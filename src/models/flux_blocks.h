// The blocks of FluxTransformer2DModel with diffusers' parameter names: the adaptive layer norms, the joint
// attention (FluxAttention + FluxAttnProcessor), the GELU-tanh feed-forward, the double-stream
// FluxTransformerBlock and the single-stream FluxSingleTransformerBlock.
//
// Every block takes silu(temb) rather than temb: each adaptive norm of diffusers computes
// linear(silu(temb)) from the same temb, so computing the SiLU once per forward gives identical values.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kiln/nn/layers.h"
#include "models/flux_embeddings.h"

namespace kiln::models {

// The modulation projection of AdaLayerNormZero / AdaLayerNormZeroSingle / AdaLayerNormContinuous:
// linear(silu(temb)) [B, chunks * dim], split into `chunks` views [B, dim] in diffusers' order.
//
// Tensor-parallel plan (kiln/nn/tensor_parallel.h), shared by FLUX and SD3: attention projections into heads
// column-parallel (each rank attends over its own heads), output projections row-parallel; feed-forward in
// column-, out row-parallel; the modulation and norm_out projections column-parallel and gathered (their
// [B, chunks * dim] outputs are tiny next to their weights, which are a third of a double block's).
class FluxModulation : public nn::Module {
 public:
  FluxModulation(int64_t dim, int64_t chunks, const nn::TensorParallel& tp = {});
  std::vector<Tensor> forward(const Tensor& silu_temb) const;
  nn::Linear linear;

 private:
  int64_t chunks_;
};

// norm_out (AdaLayerNormContinuous, elementwise_affine=False, eps 1e-6): scale comes first in diffusers'
// files.
class FluxAdaLayerNormContinuous : public nn::Module {
 public:
  explicit FluxAdaLayerNormContinuous(int64_t dim, const nn::TensorParallel& tp = {});
  Tensor forward(const Tensor& x, const Tensor& silu_temb) const;

 private:
  nn::Linear linear_;
};

// FeedForward(dim, dim_out=dim, activation_fn="gelu-approximate"): net.0.proj -> gelu(tanh) -> net.2.
class FluxFeedForward : public nn::Module {
 public:
  FluxFeedForward(int64_t dim, int64_t hidden, const nn::TensorParallel& tp = {});
  Tensor forward(const Tensor& x) const;

 private:
  nn::Linear proj_, out_;  // registered as net.0.proj and net.2 (net.1 is a parameterless Dropout)
};

// FluxAttention. With added projections (double-stream blocks) the text stream gets its own q/k/v, QK norms
// and output projection; without them and pre_only (single-stream blocks) there is no output projection.
class FluxAttention : public nn::Module {
 public:
  // Under tensor parallelism this rank holds heads / tp.size heads (an error names the model's head count
  // when it does not divide).
  FluxAttention(int64_t dim, int64_t heads, int64_t head_dim, bool added_kv, bool pre_only,
                const nn::TensorParallel& tp = {});
  // Joint attention of the text stream (first) and the image stream; returns {image out, text out}.
  std::pair<Tensor, Tensor> forward_joint(const Tensor& x, const Tensor& c, const FluxRopeTables& rope) const;
  // Self-attention over one stream (the single-stream blocks); returns [B, S, heads * head_dim], no
  // projection.
  Tensor forward_self(const Tensor& s, const FluxRopeTables& rope) const;

 private:
  // [B, S, H, D] head-split q or k after the projection, QK-normed the way torch.nn.RMSNorm rounds.
  Tensor heads_normed(const nn::Linear& proj, const nn::RMSNorm& norm, const Tensor& x) const;
  Tensor heads(const nn::Linear& proj, const Tensor& x) const;
  // RoPE, attention and head merge for q, k, v [B, S, H, D] -> [B, S, H * D] (contiguous).
  Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const FluxRopeTables& rope) const;

  int64_t heads_, head_dim_;
  nn::RMSNorm norm_q_, norm_k_;
  nn::Linear to_q_, to_k_, to_v_;
  std::unique_ptr<nn::Linear> to_out0_;  // to_out.0 (to_out.1 is a parameterless Dropout)
  std::unique_ptr<nn::RMSNorm> norm_added_q_, norm_added_k_;
  std::unique_ptr<nn::Linear> add_q_proj_, add_k_proj_, add_v_proj_, to_add_out_;
};

// Double-stream block: image x [B, N, D] and text c [B, L, D] modulated separately, attended jointly.
class FluxTransformerBlock : public nn::Module {
 public:
  FluxTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, const nn::TensorParallel& tp = {});
  // Returns {x, c} after the block; through the compiled cache when compiled (compile_repeated_blocks).
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& silu_temb,
                                    const FluxRopeTables& rope) const;
  bool supports_compile() const override { return true; }

 private:
  std::pair<Tensor, Tensor> forward_eager(const Tensor& x, const Tensor& c, const Tensor& silu_temb,
                                          const FluxRopeTables& rope) const;
  FluxModulation norm1_, norm1_context_;
  FluxAttention attn_;
  FluxFeedForward ff_, ff_context_;
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

 private:
  Tensor forward_eager(const Tensor& s, const Tensor& silu_temb, const FluxRopeTables& rope) const;
  FluxModulation norm_;
  nn::Linear proj_mlp_, proj_out_;
  FluxAttention attn_;
};

}  // namespace kiln::models
