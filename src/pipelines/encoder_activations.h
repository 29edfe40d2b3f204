// The text encoders' share of a call's activation estimate (kiln/pipelines/activation_estimate.h): the
// encoders the FLUX.1 and SD3 pipelines share, each run once per prompt (batch 1).
#pragma once

#include <cstdint>

#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/t5_encoder.h"

namespace kiln::pipelines {

int64_t t5_activation_bytes(const models::T5EncoderConfig& config, int64_t tokens, DType dtype);
int64_t clip_activation_bytes(const models::ClipTextConfig& config, DType dtype, const Device& device);

}  // namespace kiln::pipelines
