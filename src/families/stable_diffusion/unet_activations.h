// What one UNet evaluation holds at its peak, for the memory plan (kiln/pipelines/activation_estimate.h).
#pragma once

#include <cstdint>

#include "kiln/core/dtype.h"
#include "kiln/families/stable_diffusion/unet_2d_condition.h"

namespace kiln {

// Bytes of activations for a batch of `batch` latents of h x w: the skip connections the down path keeps for
// the up path, plus the largest level's transformer (its self-attention scores over the level's pixels; the
// prompt's 77 tokens are far fewer) or ResNet block.
int64_t unet_activation_bytes(const models::UNet2DConditionConfig& config, int64_t batch, int64_t h,
                              int64_t w, DType dtype);

}  // namespace kiln
