// What Qwen-Image's pipelines do beside their models: true classifier-free guidance with its norm rescale,
// and how much memory the VAE's activations take.
#pragma once

#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/pipelines/pipeline_request.h"

namespace kiln::models {
struct AutoencoderKLQwenImageConfig;
}

namespace kiln::qwen_image {

// diffusers' do_true_cfg: a negative prompt and true_cfg_scale (default 4) above 1; warns, as diffusers does,
// when one comes without the other.
struct TrueCfg {
  bool enabled = false;
  float scale = 4.0f;
};
TrueCfg true_cfg_of(const char* pipeline, const PipelineRequest& request);
// true_cfg_of's `enabled`, without its warnings.
bool true_cfg_enabled(const PipelineRequest& request);

// neg + scale * (cond - neg), each token's prediction rescaled to the norm of cond's (over the channels), in
// the predictions' dtype as diffusers rounds it.
Tensor norm_rescaled_cfg(const Tensor& cond, const Tensor& uncond, float scale);

// The VAE's decode of a batch x height x width image: its widest activations (the up path's last blocks at
// full and half resolution) and the mid-block attention over the latent's pixels.
int64_t vae_activation_bytes(const models::AutoencoderKLQwenImageConfig& config, int64_t batch,
                             int64_t height, int64_t width, DType dtype);

}  // namespace kiln::qwen_image
