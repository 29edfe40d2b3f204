// The UNet family's UNet from a diffusers folder, or from a single file in the original layout with the
// folder's config (diffusers' from_single_file(file, config=folder)). The text encoders and the VAE take the
// file's view through load_clip_text_model / load_autoencoder_kl's `weights`.
#pragma once

#include <memory>
#include <string>

#include "families/stable_diffusion/sd_single_file.h"
#include "kiln/families/stable_diffusion/unet_2d_condition.h"

namespace kiln::models {

// The UNet described by `folder`/config.json; from `file` when given, whose shapes must be the config's (an
// error names both otherwise), but for an inpainting file's 9 input channels on a base model's config of 4:
// those the file's (diffusers' from_single_file infers an inpainting file and takes the inpainting model's
// config, the base one but for in_channels). Under `tp` this rank reads its share of the transformer blocks.
std::shared_ptr<UNet2DConditionModel> load_unet(const std::string& folder, DType dtype,
                                                const StableDiffusionSingleFile* file,
                                                const nn::TensorParallel& tp = {});
}  // namespace kiln::models
