// The UNet family's components from a diffusers folder, or from a single file in the original layout with the
// folder's configs (diffusers' from_single_file(file, config=folder)): the file's component where it has one,
// the folder's where it does not (a UNet-only finetune keeps the base model's text encoders and VAE).
#pragma once

#include <memory>
#include <string>

#include "families/stable_diffusion/sd_single_file.h"
#include "kiln/families/stable_diffusion/unet_2d_condition.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"

namespace kiln::models {

// The UNet described by `folder`/config.json; from `file` when given, whose shapes must be the config's (an
// error names both otherwise).
std::shared_ptr<UNet2DConditionModel> load_unet(const std::string& folder, DType dtype,
                                                const StableDiffusionSingleFile* file);
// CLIP described by `folder`/config.json, from `weights` (a single file's view) or else the folder's.
std::shared_ptr<ClipTextModel> load_clip(const std::string& folder, DType dtype,
                                         const nn::WeightSource* weights);
// The VAE described by `folder`/config.json, from `weights` or else the folder's.
std::shared_ptr<AutoencoderKL> load_vae(const std::string& folder, DType dtype,
                                        const nn::WeightSource* weights);

}  // namespace kiln::models
