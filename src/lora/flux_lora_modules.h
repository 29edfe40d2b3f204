// Black Forest Labs' FLUX module names (the layout of their checkpoints, which kohya, ComfyUI and ai-toolkit
// LoRA files follow) and the diffusers layers each one is, for FLUX.1 and FLUX.2: the tables of diffusers'
// converters (_convert_kohya_flux_lora_to_diffusers, _convert_non_diffusers_flux2_lora_to_diffusers and
// _convert_kohya_flux2_lora_to_diffusers), written once here for both the dotted and the kohya (flat) names.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/lora/lora_keys.h"

namespace kiln::lora {

struct FluxModuleTargets {
  std::vector<std::string> modules;  // diffusers modules of the transformer, in the order up's rows feed them
  bool swap_up_halves = false;
};

// "double_blocks.3.img_attn.qkv" -> transformer_blocks.3.attn.to_q / to_k / to_v; nullopt for a name that is
// no FLUX module of `family` (Flux1 or Flux2).
std::optional<FluxModuleTargets> flux_module_targets(const std::string& dotted, ModelFamily family);

// A kohya name without its lora_unet_ prefix ("double_blocks_3_img_attn_qkv") as Black Forest Labs' dotted
// name ("double_blocks.3.img_attn.qkv"); nullopt when it is none of the family's modules.
std::optional<std::string> flux_dotted_name(const std::string& flat, ModelFamily family);

// A kohya CLIP name without its lora_te1_ / lora_te_ prefix ("text_model_encoder_layers_0_self_attn_q_proj")
// as transformers' module name ("text_model.encoder.layers.0.self_attn.q_proj"); nullopt for other layers.
std::optional<std::string> clip_dotted_name(const std::string& flat);

// True for the first segment of a Black Forest Labs module name (double_blocks, img_in, final_layer, ...).
bool is_flux_top_level_name(const std::string& segment);

}  // namespace kiln::lora
