// A transformer's modules under their original names (kiln/lora/lora_family.h's OriginalLayout, which each
// family declares), read both as Black Forest Labs writes them ("double_blocks.3.img_attn.qkv") and as kohya
// flattens them ("double_blocks_3_img_attn_qkv"), with the diffusers layers each one is: the tables of
// diffusers' converters (_convert_kohya_flux_lora_to_diffusers, _convert_non_diffusers_flux2_lora_to_diffusers,
// ...), walked the same way for every family.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/lora/lora_family.h"

namespace kiln::lora {

struct ModuleTargets {
  std::vector<std::string> modules;  // diffusers modules of the transformer, in the order up's rows feed them
  bool swap_up_halves = false;
};

// "double_blocks.3.img_attn.qkv" -> transformer_blocks.3.attn.to_q / to_k / to_v; nullopt for a name that is
// none of `layout`'s modules.
std::optional<ModuleTargets> original_module_targets(const OriginalLayout& layout, const std::string& dotted);

// A kohya name without its lora_unet_ prefix ("double_blocks_3_img_attn_qkv") as the dotted original name
// ("double_blocks.3.img_attn.qkv"); nullopt when it is none of `layout`'s modules.
std::optional<std::string> original_dotted_name(const OriginalLayout& layout, const std::string& flat);

// A kohya CLIP name without its lora_te1_ / lora_te_ prefix ("text_model_encoder_layers_0_self_attn_q_proj")
// as transformers' module name ("text_model.encoder.layers.0.self_attn.q_proj"); nullopt for other layers.
std::optional<std::string> clip_dotted_name(const std::string& flat);

// True for the first segment of a module name in Black Forest Labs' layout: the FLUX lineage's blocks and
// top-level modules (double_blocks, img_in, final_layer, distilled_guidance_layer, ...) and, when given,
// `family`'s own.
bool is_original_top_level_name(const std::string& segment, const LoraFamily* family);

}  // namespace kiln::lora
