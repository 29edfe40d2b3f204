// Chroma as lodestones ship it: one .safetensors in the original (FLUX.1-style) layout, or a GGUF made from
// it, read as diffusers' ChromaTransformer2DModel.from_single_file does: FLUX.1's renames of the blocks and
// embedders (fused qkv and linear1 split by rows), and the approximator's own (in_layer/out_layer ->
// linear_1/linear_2, norms' scale -> weight). There is no modulation weight to swap.
#pragma once

#include <memory>

#include "kiln/families/chroma/chroma_transformer.h"
#include "kiln/nn/module.h"

namespace kiln::models {

// A file holds Chroma (rather than FLUX.1, whose layout it shares) when it has the approximator, as diffusers
// tells them apart.
bool is_chroma_single_file(const nn::WeightSource& w);

// diffusers' names for the tensors of `inner` (optionally under "model.diffusion_model."). Throws kiln::Error
// naming the file and the first tensor that is missing or does not fit the config.
std::unique_ptr<nn::WeightSource> chroma_single_file_weights(std::shared_ptr<const nn::WeightSource> inner,
                                                             const ChromaTransformerConfig& config);

// The config read off the file's shapes: widths, depths, the approximator's sizes. RoPE axes cannot be read
// off shapes: Chroma's (16, 56, 56) for 128-wide heads; other head sizes need a config.json.
ChromaTransformerConfig infer_chroma_config(const nn::WeightSource& w);

}  // namespace kiln::models
