// One denoising step of the UNet family's pipelines: the UNet on the latents (twice as one batch under
// classifier-free guidance: the negative prompt's half first, as diffusers concatenates them), guided, and
// rescaled (guidance_rescale, diffusers' rescale_noise_cfg).
#pragma once

#include "kiln/core/tensor.h"
#include "kiln/families/stable_diffusion/unet_2d_condition.h"

namespace kiln::models {

struct UNetStep {
  const UNet2DConditionModel& unet;
  // The prompt's tokens [B, S, cross_dim]; under guidance [2B, S, cross_dim], the negative prompt's first.
  Tensor context;
  UNetAddedConditions added;  // SDXL's, over the same batch as context
  bool guided = false;
  float guidance_scale = 1.0f;
  float guidance_rescale = 0.0f;
  // A 9-channel inpainting UNet's: the mask [B, 1, h, w] and the masked image's latents [B, 4, h, w] side by
  // side on the channels, given after the latents' own (the same for both halves under guidance); undefined
  // for a UNet of the latents' channels.
  Tensor inpainting_channels;
};

// The noise prediction for `latents` [B, C, h, w] (already scale_model_input's; an inpainting UNet's
// channels concatenated after them) at timestep `t`, in the latents' dtype: uncond + g * (text - uncond)
// under guidance, then rescaled when guidance_rescale > 0.
Tensor unet_noise_prediction(const UNetStep& step, const Tensor& latents, float t);

// diffusers' rescale_noise_cfg: cfg * (std(text) / std(cfg)) mixed with cfg by `rescale`, per image (std
// over every other dimension, unbiased).
Tensor rescale_noise_cfg(const Tensor& cfg, const Tensor& text, float rescale);

}  // namespace kiln::models
