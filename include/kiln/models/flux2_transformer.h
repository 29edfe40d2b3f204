// Flux2Transformer2DModel (FLUX.2-dev, FLUX.2 [klein] 4B / 9B), the denoising transformer of diffusers'
// Flux2Pipeline and Flux2KleinPipeline, with diffusers' parameter names (the `transformer/` folder of a
// diffusers checkpoint loads by name) and diffusers' dtype path: the same ops in the same order, with the
// same intermediate roundings.
//
// What differs from FLUX.1: no biases anywhere; the adaptive-norm modulations are three projections shared by
// all blocks (double-stream image, double-stream text, single-stream), computed once per forward; SwiGLU
// feed-forwards; the single-stream block's q, k, v and MLP input come from one fused projection
// (to_qkv_mlp_proj) and its attention and MLP outputs go through one (to_out); 4-axis RoPE with the config's
// theta; no pooled text vector; the guidance embedding only where the config has it (FLUX.2-dev; klein has
// none).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/io/json_config.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/module.h"
#include "kiln/nn/step_cache.h"

namespace kiln::models {

// The component's config.json. Absent keys take the defaults of diffusers' Flux2Transformer2DModel.__init__
// (the FLUX.2-dev values); "out_channels": null means in_channels.
struct Flux2TransformerConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 128;
  int64_t out_channels = 128;
  int64_t num_layers = 8;
  int64_t num_single_layers = 48;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 48;
  int64_t joint_attention_dim = 15360;
  int64_t timestep_guidance_channels = 256;
  double mlp_ratio = 3.0;
  std::vector<int64_t> axes_dims_rope = {32, 32, 32, 32};
  double rope_theta = 2000;
  double eps = 1e-6;
  bool guidance_embeds = true;

  // The model width (num_attention_heads * attention_head_dim).
  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  // The SwiGLU hidden width, int(inner_dim * mlp_ratio) as diffusers computes it.
  int64_t mlp_hidden_dim() const;

  // Reads the fields of a parsed config.json. Keys starting with "_" are metadata; a "_class_name" other than
  // Flux2Transformer2DModel is an error, and so is any other key this implementation does not know (it could
  // change the architecture). The result is validated.
  static Flux2TransformerConfig from_config(const io::JsonConfig& config);
  static Flux2TransformerConfig from_json(const std::string& text, const std::string& source = "config.json");
  // Reads `path`: a config.json file, or a component folder holding one.
  static Flux2TransformerConfig from_file(const std::string& path);

  // Throws kiln::Error naming `source` when the values cannot describe a model Kiln runs.
  void validate(const std::string& source = "config.json") const;
};

class Flux2TimeGuidanceEmbedding;
class Flux2TransformerBlock;
class Flux2SingleTransformerBlock;
class Modulation;
class AdaLayerNormContinuous;

// What forward computed on the way, for comparing each stage with diffusers (filled only when asked for, and
// only by an uncompiled forward).
struct Flux2TransformerTrace {
  Tensor temb;                          // time_guidance_embed output [B, D]
  Tensor mod_img, mod_txt, mod_single;  // the shared modulation projections [B, 6D] / [B, 6D] / [B, 3D]
  Tensor x_embedded, context_embedded;  // x_embedder / context_embedder outputs
  std::vector<std::pair<Tensor, Tensor>> double_blocks;  // (text, image) after each double-stream block
  std::vector<Tensor> single_blocks;  // the joint [text; image] sequence after each single block
  Tensor norm_out;                    // norm_out of the image rows, before proj_out
};

class Flux2Transformer2DModel : public nn::Module {
 public:
  // Registers every parameter with its diffusers name and shape (nothing is allocated until load_weights).
  // With `tp` (size > 1) this rank holds its shard of every block (models/flux2_blocks.h); the embedders, the
  // shared modulations, norm_out and proj_out are column-parallel and gathered. Every rank returns the full
  // output.
  explicit Flux2Transformer2DModel(const Flux2TransformerConfig& config, const nn::TensorParallel& tp = {});
  ~Flux2Transformer2DModel() override;

  // One denoising evaluation, as Flux2Transformer2DModel.forward(return_dict=False)[0]:
  //   hidden [B, N, in_channels]     packed latents (reference-image latents appended after the noise, as the
  //                                  pipelines concatenate them), in the compute dtype (the loaded weights')
  //   encoder_hidden [B, L, joint_attention_dim]   prompt embeddings, same dtype
  //   timestep [B]                   t / 1000 as the pipelines pass it (any floating dtype; cast to the
  //   compute
  //                                  dtype and multiplied by 1000 there, as diffusers does)
  //   guidance [B]                   the guidance scale (float32), or undefined. As in diffusers, it is
  //   embedded
  //                                  only when both given and the model has a guidance embedding
  //                                  (guidance_embeds: FLUX.2-dev); klein's pipeline passes none.
  //   txt_ids [L, A], img_ids [N, A] RoPE positions, A = axes_dims_rope.size() (4): see flux2_text_ids,
  //                                  flux2_latent_ids and flux2_image_ids; any dtype, read as float32
  // -> [B, N, out_channels] in the compute dtype, for every image row (the caller keeps the first rows, those
  // of the noise).
  Tensor forward(const Tensor& hidden, const Tensor& encoder_hidden, const Tensor& timestep,
                 const Tensor& guidance, const Tensor& txt_ids, const Tensor& img_ids,
                 Flux2TransformerTrace* trace = nullptr) const;

  // Compiled mode (kiln/nn/compile.h): compile() compiles the whole forward per input shape;
  // compile_repeated_blocks() compiles one double-stream and one single-stream block program, shared by all
  // the blocks, and runs the rest eagerly.
  bool supports_compile() const override { return true; }
  // The double-stream transformer_blocks, then the single_transformer_blocks.
  std::vector<nn::BlockList> repeated_blocks() const override;
  // Step caching (kiln/nn/step_cache.h), as diffusers 0.42.1's hooks run on FLUX.2: MagCache over the
  // double-stream blocks then the single-stream ones (its residual: the image rows, reference images'
  // included, less the blocks' image input), with the ratios of a calibration (none are published for
  // FLUX.2); TaylorSeer forecasting every attention (transformer_blocks.N.attn,
  // single_transformer_blocks.N.attn). First Block Cache is refused (flux2_first_block_cache_refusal).
  nn::StepCache* step_cache() const override { return &step_cache_; }

  const Flux2TransformerConfig& config() const { return config_; }
  // The dtype the model computes in (its loaded weights').
  DType dtype() const { return x_embedder_.dtype(); }

 private:
  mutable nn::StepCache step_cache_;  // a call's state; calls to a pipeline are served one at a time
  Tensor forward_eager(const Tensor& hidden, const Tensor& encoder_hidden, const Tensor& timestep,
                       const Tensor& guidance, const Tensor& txt_ids, const Tensor& img_ids,
                       Flux2TransformerTrace* trace) const;
  Flux2TransformerConfig config_;
  std::unique_ptr<Flux2TimeGuidanceEmbedding> time_guidance_embed_;
  std::unique_ptr<Modulation> double_stream_modulation_img_, double_stream_modulation_txt_,
      single_stream_modulation_;
  nn::Linear x_embedder_;
  nn::Linear context_embedder_;
  std::vector<std::unique_ptr<Flux2TransformerBlock>> transformer_blocks_;
  std::vector<std::unique_ptr<Flux2SingleTransformerBlock>> single_transformer_blocks_;
  std::unique_ptr<AdaLayerNormContinuous> norm_out_;
  nn::Linear proj_out_;
};

// Why First Block Cache is refused on FLUX.2: diffusers 0.42.1 has none that works there (its single-stream
// blocks return text and image tokens as one tensor, which its First Block Cache cannot take apart), so there
// are no decisions or image of diffusers' to match. The message names the caches that do work.
std::string flux2_first_block_cache_refusal();

// Builds the model from `folder` (a diffusers transformer/ component: config.json and one or several
// safetensors files) and loads its weights converted to `dtype` (no copy when stored so). With `tp`, only
// this rank's slices are read from the files.
std::unique_ptr<Flux2Transformer2DModel> load_flux2_transformer(const std::string& folder, DType dtype,
                                                                const nn::TensorParallel& tp = {});

// The position ids the FLUX.2 pipelines build (int64 in diffusers, read as float32 by the transformer; here
// float32, exact up to 2^24):
// Flux2Pipeline._prepare_latent_ids: (t=0, row, col, l=0) of the packed latent grid, row-major,
// [grid_height * grid_width, 4]. For an image of H x W pixels the grid is (H / 16) x (W / 16), floored.
Tensor flux2_latent_ids(int64_t grid_height, int64_t grid_width);
// Flux2Pipeline._prepare_text_ids: (0, 0, 0, l) for l = 0 .. length - 1, [length, 4].
Tensor flux2_text_ids(int64_t length);
// Flux2Pipeline._prepare_image_ids for reference images whose latent grids are `grids` (rows, cols):
// (t = 10 + 10 i, row, col, 0) for image i, the images one after another, [sum of rows * cols, 4].
Tensor flux2_image_ids(const std::vector<std::pair<int64_t, int64_t>>& grids);

}  // namespace kiln::models
