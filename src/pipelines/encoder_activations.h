// Shares of a call's activation estimate (kiln/pipelines/activation_estimate.h) that the FLUX.1 and SD3
// pipelines have in common: their text encoders, each run once per prompt (batch 1), and one step of a
// transformer whose MLP is four times its width.
#pragma once

#include <cstdint>

#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/t5_encoder.h"

namespace kiln::pipelines {

int64_t t5_activation_bytes(const models::T5EncoderConfig& config, int64_t tokens, DType dtype);
int64_t clip_activation_bytes(const models::ClipTextConfig& config, DType dtype, const Device& device);
int64_t dit_step_activation_bytes(int64_t batch, int64_t tokens, int64_t heads, int64_t head_dim, DType dtype,
                                  const Device& device);

}  // namespace kiln::pipelines
