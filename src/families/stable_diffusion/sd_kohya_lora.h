// kohya's (sd-scripts) LoRA names for the UNets of SD1.x and SDXL, as diffusers reads them
// (_maybe_map_sgm_blocks_to_diffusers, _convert_unet_lora_key): lora_unet_<module> with '_' for '.', the
// module named by diffusers (SD1.x files: "down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q") or by
// the original SGM UNet (SDXL files: "input_blocks_4_1_transformer_blocks_0_attn1_to_q",
// "middle_block_1_...", "output_blocks_0_1_..."), whose blocks map to diffusers' by the UNet's levels and
// layers_per_block as the single-file conversion maps them (sd_single_file.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kiln/lora/lora_family.h"

namespace kiln::models {

// `flat`: a kohya name without lora_unet_. Its diffusers module in a UNet of `levels` levels of
// `layers_per_block` ResNets: the attentions' Linears and proj_in / proj_out, the embeddings' Linears and
// the ResNets' time_emb_proj, and the convolutions LoCon files reach (conv_in, the ResNets' conv1 / conv2 /
// conv_shortcut, the down- and upsamplers' conv, conv_out). nullopt for no module of the UNet.
std::optional<lora::KohyaModule> kohya_unet_module(const std::string& flat, int64_t levels,
                                                   int64_t layers_per_block);

// What LoRA means for Stable Diffusion 1.x and SDXL pipelines: diffusers' own layout and kohya's, into the
// UNet, CLIP-L (text_encoder; kohya's lora_te_ / lora_te1_) and SDXL's OpenCLIP bigG (text_encoder_2;
// lora_te2_), for a UNet of `levels` levels of `layers_per_block` ResNets.
lora::LoraFamily stable_diffusion_lora_family(int64_t levels, int64_t layers_per_block);

}  // namespace kiln::models
