// Qwen-Image's transformer as one file: ComfyUI's qwen_image_bf16.safetensors (Comfy-Org's split files) and
// the GGUFs made from it (city96's and QuantStack's, arch "qwen_image"), read as diffusers'
// QwenImageTransformer2DModel.from_single_file reads them. Qwen-Image's original layout is diffusers' own
// (ComfyUI's model keeps diffusers' module names; diffusers maps the checkpoint through the identity), so
// only an optional "model.diffusion_model." prefix (ComfyUI's checkpoint saves) is taken off. A GGUF's
// quantized Linear weights stay quantized; its F32 / F16 / BF16 tensors (norms, biases, the embedders city96
// keeps at full precision) load as any other.
#pragma once

#include <memory>
#include <string>

#include "kiln/families/qwen_image/qwen_image_transformer.h"
#include "kiln/nn/module.h"

namespace kiln::models {

// Whether `w` holds a Qwen-Image transformer (img_in, txt_norm and transformer_blocks.0.img_mod.1 weights,
// with or without the prefix).
bool is_qwen_image_single_file(const nn::WeightSource& w);

// The config read off the file's shapes: widths, heads (from the q norm's width), depth, channels (2 x 2
// patches). What shapes cannot tell takes Qwen-Image's values (axes_dims_rope (16, 56, 56) for 128-wide
// heads; zero_cond_t off, so Qwen-Image-Edit-2511 needs its config.json); other head widths need a
// config.json. Throws kiln::Error naming the file and the tensor at fault.
QwenImageTransformerConfig infer_qwen_image_config(const nn::WeightSource& w);

// The transformer of the single file `path` (.safetensors or .gguf) with its weights in `dtype`; `config`: a
// config.json or a folder holding one, empty: read off the file's shapes. Strict: every tensor used, names
// and shapes checked. A file of another family is refused naming the file (and a GGUF's
// general.architecture).
std::unique_ptr<QwenImageTransformer2DModel> load_qwen_image_single_file(const std::string& path,
                                                                         const std::string& config,
                                                                         DType dtype);

}  // namespace kiln::models
