// The conditioning inputs of FluxTransformer2DModel: the sinusoidal timestep projection and the
// time/guidance/pooled-text embedding (diffusers' Timesteps, TimestepEmbedding, PixArtAlphaTextProjection,
// CombinedTimestep[Guidance]TextProjEmbeddings), and the rotary tables of FluxPosEmbed.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/models/flux_transformer.h"
#include "kiln/nn/layers.h"

namespace kiln::models {

// get_timestep_embedding(t, dim, flip_sin_to_cos=True, downscale_freq_shift=0): [cos(t*f), sin(t*f)] in
// float32 for t [B] (read as float32), f_i = exp(-ln(10000) * i / (dim / 2)) as torch computes it in float32.
Tensor flux_timestep_sinusoid(const Tensor& t, int64_t dim);

// linear_1 -> SiLU -> linear_2: TimestepEmbedding (act "silu") and PixArtAlphaTextProjection(act_fn="silu")
// share this shape and these parameter names. FLUX.2's TimestepEmbedding(sample_proj_bias=False) has no
// biases.
class FluxMlpEmbedding : public nn::Module {
 public:
  // Under tensor parallelism linear_1 is column- and linear_2 row-parallel (one all-reduce).
  FluxMlpEmbedding(int64_t in_features, int64_t dim, const nn::TensorParallel& tp = {}, bool bias = true);
  Tensor forward(const Tensor& x) const;
  nn::Linear linear_1, linear_2;
};

// temb = timestep_embedder(proj(t)) [+ guidance_embedder(proj(g))] + text_embedder(pooled), where proj is the
// 256-wide sinusoid cast to pooled's dtype; t and g are already scaled by 1000.
class FluxTimeTextEmbedding : public nn::Module {
 public:
  FluxTimeTextEmbedding(int64_t dim, int64_t pooled_dim, bool guidance_embeds,
                        const nn::TensorParallel& tp = {});
  Tensor forward(const Tensor& timestep, const Tensor& guidance, const Tensor& pooled) const;

 private:
  FluxMlpEmbedding timestep_embedder_;
  std::unique_ptr<FluxMlpEmbedding> guidance_embedder_;
  FluxMlpEmbedding text_embedder_;
};

// FluxPosEmbed: cos and sin [S, sum(axes_dims)] float32 for ids [S, axes] (read as float32). Per axis of
// width d: angle = id * theta^(-2k/d), k < d/2, in float64, cos/sin in float64 rounded to float32, each value
// repeated for the pair (2k, 2k+1) it rotates; the axes follow one another along the head dim.
struct FluxRopeTables {
  Tensor cos, sin;
};
FluxRopeTables flux_rope_tables(const Tensor& ids, const std::vector<int64_t>& axes_dims, double theta);

}  // namespace kiln::models
