// Z-Image's transformer as ComfyUI distributes it (z_image_turbo_bf16.safetensors) and as the community
// quantizes it (GGUF files of that layout), read as diffusers' ZImageTransformer2DModel.from_single_file
// converts it (convert_z_image_transformer_checkpoint_to_diffusers): the original module names (x_embedder,
// final_layer, attention.out, attention.q_norm / k_norm), each block's fused attention.qkv split into to_q,
// to_k and to_v by rows (quantized rows stay quantized), an optional "model.diffusion_model." prefix, and
// ComfyUI's unused norm_final left out.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/families/z_image/z_image_transformer.h"
#include "kiln/nn/module.h"

namespace kiln::models {

// Whether `w` holds a Z-Image transformer in the original layout (diffusers' key:
// layers.0.adaLN_modulation.0.weight, with or without the prefix, beside a fused attention.qkv).
bool is_z_image_single_file(const nn::WeightSource& w);

// diffusers' names for the tensors of `inner`. Throws kiln::Error naming the file and the first tensor that
// is missing or does not fit the config.
std::unique_ptr<nn::WeightSource> z_image_single_file_weights(std::shared_ptr<const nn::WeightSource> inner,
                                                              const ZImageTransformerConfig& config);

// The file tensors the model never reads (ComfyUI's norm_final), for LoadOptions::ignore_prefixes.
std::vector<std::string> z_image_single_file_ignored(const nn::WeightSource& w);

// The config read off the file's shapes: widths, depths, heads (from the q/k norms' width). What shapes
// cannot tell takes Z-Image-Turbo's values (axes_dims (32, 48, 48) for 128-wide heads, axes_lens (1536, 512,
// 512), rope_theta 256); other head sizes need a config.json.
ZImageTransformerConfig infer_z_image_config(const nn::WeightSource& w);

}  // namespace kiln::models
