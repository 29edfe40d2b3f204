// How a LoRA file names its tensors, and which layers of a pipeline its pairs reach. The layouts Kiln reads,
// as diffusers' loaders and converters read them (lora_pipeline.py, lora_conversion_utils.py):
//   diffusers / PEFT   transformer.<module>.lora_A.weight / .lora_B.weight [, transformer.<module>.alpha]
//                      and text_encoder.* / text_encoder_2.* for the text encoders a pipeline loads LoRA
//                      into (FLUX.1: CLIP; SD3: CLIP-L and CLIP-G; FLUX.2: none); FLUX.2's
//                      diffusion_model.<module>
//   kohya (sd-scripts) lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight / .lora_up.weight / .alpha:
//                      Black Forest Labs' modules with '_' for '.' (FLUX.1, FLUX.2), lora_te1_* /
//                      lora_te_* for CLIP; a UNet's (SD1.5, SDXL) in diffusers' or SGM's names as its family
//                      maps them (LoraFamily::kohya_denoiser_module), lora_te2_* for SDXL's second CLIP
//                      (elsewhere T5's, skipped)
//   Each family says which layouts it takes (LoraFamily::formats); the others are refused by name. Text
//   encoders' pairs are read only where the family loads LoRA into them.
//   Black Forest Labs  [diffusion_model. | base_model.model.]double_blocks.0.img_attn.qkv.lora_A.weight (or
//                      lora_down / lora_up, ComfyUI's), single_blocks.*, img_in, txt_in, final_layer, ...
//   XLabs              double_blocks.0.processor.qkv_lora1.down.weight / .up.weight, proj_lora1, qkv_lora2,
//                      proj_lora2; single_blocks.0.processor.qkv_lora / proj_lora (FLUX.1)
// A pair on a layer the model splits (Black Forest Labs' fused qkv and linear1) reaches several layers: its
// up rows are split among them by their widths and its down is shared, as diffusers' converters do. Only
// names are read here (no tensor data): `kiln info` and the fuzz target use this alone.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/lora/lora_family.h"

namespace kiln::lora {

// A layer of a pipeline: its component ("transformer", "text_encoder", "text_encoder_2") and its diffusers
// module name in that component ("transformer_blocks.0.attn.to_q").
struct LoraTarget {
  std::string component;
  std::string module;
  bool operator==(const LoraTarget&) const = default;
};

// One low-rank pair of a file and the layers it reaches.
struct LoraPairKeys {
  std::string name;      // the module as the file names it ("lora_unet_double_blocks_0_img_attn_qkv")
  std::string down, up;  // the names of its A [rank, in] and B [out, rank] tensors
  std::string alpha;     // the name of its alpha tensor, empty when it has none
  // One layer, or several for a fused layer the model keeps apart: up's rows are then split among them in
  // this order, by each layer's out_features, and down is shared.
  std::vector<LoraTarget> targets;
  // Black Forest Labs' final adaLN projection is (shift, scale), diffusers' norm_out.linear (scale, shift):
  // up's two halves are swapped.
  bool swap_up_halves = false;
};

struct LoraKeys {
  LoraFormat format = LoraFormat::Diffusers;
  std::vector<LoraPairKeys> pairs;
  // Tensors that fit no rule of the layout (a module Kiln does not know, a pair without its other half), in
  // file order: an error unless the caller was asked to skip them.
  std::vector<std::pair<std::string, std::string>> unknown;  // (tensor, why)
  // Tensors diffusers ignores too (DoRA scales, T5 LoRA, full-weight differences), with why.
  std::vector<std::pair<std::string, std::string>> skipped;
};

// The layout of `names` (a file's tensor names, in file order), or nullopt when they are not a LoRA file's.
// Black Forest Labs' layout is told by its top-level modules: those of the FLUX lineage, and `family`'s own
// when given.
std::optional<LoraFormat> detect_lora_format(const std::vector<std::string>& names,
                                             const LoraFamily* family = nullptr);

// Converts a file's tensor names for `family`. Throws kiln::Error naming the file's layout and the family
// when the layout is not one the family takes (LoraFamily::formats), when the names are not a LoRA file's, or
// when a tensor is of a kind Kiln does not run (DoRA magnitudes, lora_B biases), naming it.
LoraKeys plan_lora_keys(const std::vector<std::string>& names, const LoraFamily& family);

}  // namespace kiln::lora
