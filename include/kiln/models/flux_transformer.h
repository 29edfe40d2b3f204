// FluxTransformer2DModel (FLUX.1-schnell / FLUX.1-dev), the denoising transformer of diffusers' FluxPipeline,
// reproduced with diffusers' parameter names (so the `transformer/` folder of a diffusers checkpoint loads by
// name) and diffusers' dtype path: the same ops in the same order, with the same intermediate roundings, so a
// bfloat16 model gives what diffusers gives in bfloat16, not a float32 result rounded at the end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/io/json_config.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/module.h"

namespace kiln::models {

// The component's config.json. Absent keys take the defaults of diffusers' FluxTransformer2DModel.__init__
// (which are the FLUX.1 values); "out_channels": null means in_channels.
struct FluxTransformerConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  int64_t out_channels = 64;
  int64_t num_layers = 19;
  int64_t num_single_layers = 38;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;
  int64_t pooled_projection_dim = 768;
  bool guidance_embeds = false;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};

  // The model width (num_attention_heads * attention_head_dim).
  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }

  // Reads the fields of a parsed config.json. Keys starting with "_" (_class_name, _diffusers_version, ...)
  // are metadata; a "_class_name" other than FluxTransformer2DModel is an error, and so is any other key this
  // implementation does not know (it could change the architecture). The result is validated.
  static FluxTransformerConfig from_config(const io::JsonConfig& config);
  // The same from JSON text; `source` names it in errors.
  static FluxTransformerConfig from_json(const std::string& text, const std::string& source = "config.json");
  // Reads `path`: a config.json file, or a component folder holding one.
  static FluxTransformerConfig from_file(const std::string& path);

  // Throws kiln::Error naming `source` when the values cannot describe a model Kiln runs (patch_size != 1,
  // non-positive sizes, RoPE axes that do not add up to the head dim, ...).
  void validate(const std::string& source = "config.json") const;
};

class FluxTimeTextEmbedding;
class FluxTransformerBlock;
class FluxSingleTransformerBlock;
class AdaLayerNormContinuous;

class FluxTransformer2DModel : public nn::Module {
 public:
  // Registers every parameter with its diffusers name and shape (nothing is allocated until load_weights).
  // With `tp` (size > 1) this rank holds its shard of every block by the plan in models/dit_layers.h; the
  // embedders, norm_out and proj_out are column-parallel and gathered. Every rank returns the full output.
  explicit FluxTransformer2DModel(const FluxTransformerConfig& config, const nn::TensorParallel& tp = {});
  ~FluxTransformer2DModel() override;

  // One denoising evaluation, as FluxTransformer2DModel.forward(return_dict=False)[0]:
  //   hidden [B, N, in_channels]        packed latents, in the compute dtype (that of the loaded weights)
  //   encoder_hidden [B, L, joint_attention_dim], pooled [B, pooled_projection_dim]   same dtype
  //   timestep [B]                      t / 1000 as the pipeline passes it (any floating dtype; it is cast to
  //                                     the compute dtype and multiplied by 1000 there, as diffusers does)
  //   guidance [B]                      the guidance scale (float32) when config.guidance_embeds, else
  //   undefined txt_ids [L, A], img_ids [N, A]    RoPE positions, A = axes_dims_rope.size() (see
  //   flux_text_ids and
  //                                     flux_latent_image_ids); any dtype, read as float32 like diffusers
  // -> [B, N, out_channels] in the compute dtype: the predicted velocity, packed like `hidden`.
  Tensor forward(const Tensor& hidden, const Tensor& encoder_hidden, const Tensor& pooled,
                 const Tensor& timestep, const Tensor& guidance, const Tensor& txt_ids,
                 const Tensor& img_ids) const;

  // Compiled mode (kiln/nn/compile.h): compile() compiles the whole forward per input shape;
  // compile_repeated_blocks() compiles one double-stream and one single-stream block program, shared by all
  // the blocks, and runs the rest eagerly.
  bool supports_compile() const override { return true; }
  // The double-stream transformer_blocks, then the single_transformer_blocks.
  std::vector<nn::BlockList> repeated_blocks() const override;
  // Step caching (kiln/nn/step_cache.h): the double-stream blocks then the single-stream ones, as diffusers
  // hooks them (its first block transformer_blocks.0, its last single_transformer_blocks' last).
  nn::StepCache* step_cache() const override { return &step_cache_; }

  const FluxTransformerConfig& config() const { return config_; }

  // diffusers' FluxTransformer2DModel.from_single_file: a FLUX.1 transformer saved as one file in Black
  // Forest Labs' layout, .safetensors or .gguf (kiln/models/flux_single_file.h). Block-quantized GGUF weights
  // of Linear layers stay quantized in memory; everything else is converted to `dtype`.
  struct SingleFileOptions {
    // A config.json or a folder holding one (a diffusers transformer/ folder); empty: read off the file's
    // shapes (FLUX.1 widths and RoPE axes).
    std::string config;
    DType dtype = bfloat16;
  };
  static std::unique_ptr<FluxTransformer2DModel> from_single_file(const std::string& path,
                                                                  const SingleFileOptions& options);

 private:
  mutable nn::StepCache step_cache_;  // a call's state; calls to a pipeline are served one at a time
  Tensor forward_eager(const Tensor& hidden, const Tensor& encoder_hidden, const Tensor& pooled,
                       const Tensor& timestep, const Tensor& guidance, const Tensor& txt_ids,
                       const Tensor& img_ids) const;
  FluxTransformerConfig config_;
  std::unique_ptr<FluxTimeTextEmbedding> time_text_embed_;
  nn::Linear context_embedder_;
  nn::Linear x_embedder_;
  std::vector<std::unique_ptr<FluxTransformerBlock>> transformer_blocks_;
  std::vector<std::unique_ptr<FluxSingleTransformerBlock>> single_transformer_blocks_;
  std::unique_ptr<AdaLayerNormContinuous> norm_out_;
  nn::Linear proj_out_;
};

// Builds the model from `folder` (a diffusers transformer/ component: config.json and one or several
// safetensors files) and loads its weights converted to `dtype` (no copy when stored so).
// With `tp`, only this rank's slices are read from the files.
std::unique_ptr<FluxTransformer2DModel> load_flux_transformer(const std::string& folder, DType dtype,
                                                              const nn::TensorParallel& tp = {});

// FluxPipeline._prepare_latent_image_ids: positions (0, row, col) of the packed latent grid, row-major,
// as [grid_height * grid_width, 3] in `dtype` (the pipeline uses the prompt embeddings' dtype; bfloat16
// rounds coordinates above 256). For an image of H x W pixels the grid is (H / 16) x (W / 16), floored.
Tensor flux_latent_image_ids(int64_t grid_height, int64_t grid_width, DType dtype = float32);
// The text positions FluxPipeline.encode_prompt makes: zeros [length, 3] in `dtype` (the text encoder's).
Tensor flux_text_ids(int64_t length, DType dtype = float32);

// FluxPipeline._pack_latents: latents [B, C, h, w] as tokens of 2 x 2 patches, [B, (h/2)(w/2), 4C]; and
// _unpack_latents, back to [B, C, h, w] for the latents' grid h x w.
Tensor flux_pack_latents(const Tensor& latents);
Tensor flux_unpack_latents(const Tensor& packed, int64_t height, int64_t width);

}  // namespace kiln::models
