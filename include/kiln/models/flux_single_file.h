// FLUX.1 transformers saved as one file in Black Forest Labs' original layout (flux1-dev.safetensors, and
// the GGUF quantizations made from it), read as diffusers' FluxTransformer2DModel.from_single_file does:
// the same renames, the fused qkv (and single-block qkv+mlp) weights split by rows, and the final norm's
// (shift, scale) halves swapped to diffusers' (scale, shift). Splits and the swap work on whole rows, so
// block-quantized GGUF weights are split without being dequantized.
#pragma once

#include <memory>
#include <string>

#include "kiln/lora/lora_family.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/nn/mapped_weights.h"
#include "kiln/nn/module.h"

namespace kiln::models {

// diffusers' names for the tensors of a BFL-layout file `inner` (optionally under "model.diffusion_model.",
// as in ComfyUI checkpoints, whose other components are then ignored). Throws kiln::Error naming the file and
// the first BFL tensor that is missing or has rows the config does not expect.
std::unique_ptr<nn::WeightSource> flux_single_file_weights(std::shared_ptr<const nn::WeightSource> inner,
                                                           const FluxTransformerConfig& config);

// The config of a FLUX.1 transformer read off a BFL-layout file's shapes (widths, depth, guidance), as
// diffusers picks a FLUX.1 config for such files. RoPE axes cannot be read off shapes: FLUX.1's (16, 56, 56)
// is used for 128-wide heads, and other head sizes are an error asking for a config.json.
FluxTransformerConfig infer_flux_config(const nn::WeightSource& bfl_weights);

// The renames FLUX.1 shares with the transformers built on its blocks (Chroma): the embedders (img_in,
// txt_in), every block's attention, QK norms and feed-forwards (the fused qkv and linear1 split for a model
// `inner_dim` wide), and the final projection. FLUX.1 adds its modulations and time embeddings.
void add_flux_backbone_renames(nn::MappingBuilder& m, int64_t inner_dim, int64_t double_blocks,
                               int64_t single_blocks);
// The same modules as LoRA files in the original layout name them (kohya, ComfyUI): the backbone's linear
// layers under their BFL names with the diffusers layers each one is (a fused qkv or linear1 names several).
lora::OriginalLayout flux_backbone_lora_layout();
// The number of blocks `w` names "<prefix><kind><i>." (kind "double_blocks." or "single_blocks.").
int64_t count_single_file_blocks(const nn::WeightSource& w, const std::string& prefix,
                                 const std::string& kind);

}  // namespace kiln::models
