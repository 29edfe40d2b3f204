// Stable Diffusion 3 / 3.5 transformers saved as one file in Stability AI's original layout
// (sd3.5_medium.safetensors, sd3.5_large.safetensors, and GGUF quantizations of them), read as diffusers'
// SD3Transformer2DModel.from_single_file does: joint_blocks.N.{x_block, context_block} renamed, fused qkv
// split by rows, and the (shift, scale) projections of the final norm and of the last block's context norm
// swapped to diffusers' (scale, shift).
#pragma once

#include <memory>

#include "kiln/models/sd3_transformer.h"
#include "kiln/nn/module.h"

namespace kiln::models {

// diffusers' names for the tensors of an SAI-layout file `inner` (optionally under "model.diffusion_model.",
// as in ComfyUI checkpoints holding the text encoders and VAE too, which are then ignored). Throws
// kiln::Error naming the file and the first SAI tensor that is missing or has rows the config does not
// expect.
std::unique_ptr<nn::WeightSource> sd3_single_file_weights(std::shared_ptr<const nn::WeightSource> inner,
                                                          const SD3TransformerConfig& config);

}  // namespace kiln::models
