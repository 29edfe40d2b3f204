// The blocks of ZImageTransformer2DModel (diffusers' transformer_z_image.py): its attention (q/k/v and out
// without biases, per-head RMSNorm on q and k, interleaved RoPE), its SwiGLU feed-forward and the block
// around them, with or without the timestep's modulation; and the rotary tables of its RopeEmbedder.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/nn/layers.h"

namespace kiln::models {

// Attention(dim_head = dim / heads, qk_norm="rms_norm", eps=1e-5, bias=False, out_bias=False) with
// ZSingleStreamAttnProcessor: to_q/to_k/to_v, norm_q/norm_k (diffusers' RMSNorm over the head), RoPE, SDPA
// over the whole sequence, to_out.0.
class ZImageAttention : public nn::Module {
 public:
  ZImageAttention(int64_t dim, int64_t heads, const nn::TensorParallel& tp = {});
  // x [B, S, dim], cos/sin [S, head_dim] float32 -> [B, S, dim].
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin) const;

 private:
  int64_t heads_, head_dim_;  // this rank's heads
  nn::Linear to_q_, to_k_, to_v_, to_out_;
  nn::RMSNorm norm_q_, norm_k_;
};

// FeedForward: w2(silu(w1(x)) * w3(x)), no biases.
class ZImageFeedForward : public nn::Module {
 public:
  ZImageFeedForward(int64_t dim, int64_t hidden, const nn::TensorParallel& tp = {});
  Tensor forward(const Tensor& x) const;

 private:
  nn::Linear w1_, w2_, w3_;
};

// ZImageTransformerBlock. With modulation (noise_refiner, layers): adaLN_modulation.0 = Linear(adaln_dim,
// 4 * dim) of the timestep embedding (no SiLU) gives scale_msa, gate_msa, scale_mlp, gate_mlp;
//   x += tanh(gate_msa) * attention_norm2(attention(attention_norm1(x) * (1 + scale_msa)))
//   x += tanh(gate_mlp) * ffn_norm2(feed_forward(ffn_norm1(x) * (1 + scale_mlp)))
// Without (context_refiner): the same with no scales and gates.
class ZImageTransformerBlock : public nn::Module {
 public:
  ZImageTransformerBlock(int64_t dim, int64_t heads, int64_t ffn_hidden, double norm_eps, bool modulation,
                         int64_t adaln_dim, const nn::TensorParallel& tp = {});
  // x [B, S, dim], cos/sin [S, head_dim], adaln [B, adaln_dim] (undefined without modulation).
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& adaln) const;
  bool supports_compile() const override { return true; }

 private:
  Tensor forward_eager(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& adaln) const;
  bool modulation_;
  ZImageAttention attention_;
  ZImageFeedForward feed_forward_;
  nn::RMSNorm attention_norm1_, ffn_norm1_, attention_norm2_, ffn_norm2_;
  std::unique_ptr<nn::Linear> adaln_modulation_;
};

// RopeEmbedder: for positions ids [S][3] the tables cos, sin [S, sum(axes_dims)] float32. Per axis of width
// d: angle = id * theta^(-2k/d) in float64, rounded to float32, its cos and sin in float32 (torch.polar),
// each repeated for the pair (2k, 2k+1) it rotates; the axes follow one another.
struct ZImageRope {
  Tensor cos, sin;
};
ZImageRope z_image_rope(const std::vector<std::array<int64_t, 3>>& ids, const std::vector<int64_t>& axes_dims,
                        double theta);

}  // namespace kiln::models
