// Stable Diffusion 1.x, SDXL base and the SDXL refiner as almost every finetune ships them: ONE .safetensors
// (or GGUF) in the original Stability layout holding the UNet (model.diffusion_model.*: input_blocks /
// middle_block / output_blocks), the text encoder(s) (SD1.x: cond_stage_model.transformer.*, HF CLIP-L; SDXL:
// CLIP-L at conditioner.embedders.0.transformer.* and OpenCLIP bigG at conditioner.embedders.1.model.*; the
// refiner: bigG alone, at conditioner.embedders.0.model.*) and the VAE (first_stage_model.*), read as
// diffusers' from_single_file converts them (convert_ldm_unet_checkpoint, convert_ldm_clip_checkpoint,
// convert_open_clip_checkpoint, convert_ldm_vae_checkpoint). Each component is a view of the file under
// diffusers' names: renames are zero-copy, bigG's fused attn.in_proj rows are split into q/k/v, the VAE's
// 1x1-conv attention weights are viewed as matrices, bigG's text_projection is transposed. Inpainting UNets
// (9 input channels) are read as the others. SD2.x files hold OpenCLIP-H at cond_stage_model.model.*, read
// as diffusers reads it into SD2's CLIPTextModel (its 24th layer and its projection unused).
// Also read: stable-diffusion.cpp's names (`sd -M convert`'s GGUF files: SDXL's CLIP-L at
// cond_stage_model.transformer.*, bigG at cond_stage_model.1.transformer.* in transformers' names with q/k/v
// fused as self_attn.in_proj, the refiner's bigG at cond_stage_model.transformer.*), and a UNet alone without
// the model.diffusion_model. prefix (city96's ComfyUI-GGUF files). Quantized tensors (GGUF blocks, fp8) are
// passed through as stored, so Linear weights stay quantized (nn::LoadOptions::keep_quantized).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/nn/module.h"

namespace kiln::models {

struct StableDiffusionSingleFile {
  // SDXLRefiner: stabilityai/stable-diffusion-xl-refiner-1.0's sd_xl_refiner_1.0.safetensors and its
  // finetunes (one text tower, 5 time ids), which StableDiffusionXLImg2ImgPipeline runs.
  // SD2: stabilityai's 2.0 / 2.1 (768 v-prediction and 512 base) files and their finetunes, which
  // StableDiffusionPipeline runs as SD1.x (the folder's configs say v-prediction and the widths).
  enum class Kind { SD1, SD2, SDXL, SDXLRefiner };
  Kind kind = Kind::SD1;
  // What the UNet's shapes say (diffusers reads the same off the file; the rest of each config, such as the
  // head counts, comes from a diffusers folder or the family's defaults).
  int64_t in_channels = 0;  // 4, or an inpainting UNet's 9
  int64_t cross_attention_dim = 0;
  int64_t layers_per_block = 0;             // the same at every level (diffusers' conversion assumes it)
  std::vector<int64_t> block_out_channels;  // per level, from each level's first ResNet
  // Each component under diffusers' names, holding exactly the tensors models::UNet2DConditionModel,
  // ClipTextModel ("text_model.*", "text_projection.weight") and AutoencoderKL load; null when the file
  // lacks it (UNet-only finetunes). unet is never null; text_encoder_2 is null for SD1.x, text_encoder for
  // the refiner.
  std::shared_ptr<const nn::WeightSource> unet, text_encoder, text_encoder_2, vae;
};

// "SD1.x", "SD2.x", "SDXL" or "SDXL refiner".
const char* kind_name(StableDiffusionSingleFile::Kind kind);
// The class diffusers' from_single_file runs a file of `kind` with (its inpainting sibling for a 9-channel
// UNet) and the Hugging Face repo whose configs it takes by default (diffusers'
// DIFFUSERS_DEFAULT_PIPELINE_PATHS).
const char* single_file_class(StableDiffusionSingleFile::Kind kind, bool inpainting);
const char* default_config(StableDiffusionSingleFile::Kind kind, bool inpainting = false);

// Opens `path` (nn::open_weight_file) and reads it as below.
StableDiffusionSingleFile open_stable_diffusion_single_file(const std::string& path);

// Reads an open file. Throws kiln::Error naming the file and what it looks like when it is not an SD1.x,
// SD2.x, SDXL base or SDXL refiner checkpoint in the original layout, and naming every tensor that no
// component uses and that is not one the format deliberately carries beside the weights (EMA copies, DDPM and
// sampler buffers, CLIP's position_ids, OpenCLIP's logit_scale, the VAE's training loss).
StableDiffusionSingleFile read_stable_diffusion_single_file(std::shared_ptr<const nn::WeightSource> file);

// A module of the original (SGM / ldm) UNet ("input_blocks.4.1.transformer_blocks.0.attn1.to_q",
// "middle_block.1.proj_in", "output_blocks.2.2.conv") as diffusers' UNet2DConditionModel names it for a UNet
// of `levels` levels of `layers_per_block` ResNets each ("down_blocks.1.attentions.1.transformer_blocks.0.
// attn1.to_q"), as the single-file conversion maps its weights; nullopt for none of its modules.
std::optional<std::string> sgm_unet_module(const std::string& dotted, int64_t levels,
                                           int64_t layers_per_block);

}  // namespace kiln::models
