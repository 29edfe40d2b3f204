// SD3Transformer2DModel (Stable Diffusion 3 / 3.5 MMDiT), the denoising transformer of diffusers'
// StableDiffusion3Pipeline, with diffusers' parameter names (a diffusers `transformer/` folder loads by name)
// and diffusers' dtype path (the same ops in the same order, with the same intermediate roundings).
//
// One class covers the released variants through config.json alone:
//   3.5 Medium (MMDiT-X): dual_attention_layers [0..12] add an image-only self-attention (attn2) to those
//                         blocks; qk_norm "rms_norm"; a 384 x 384 position table.
//   3.5 Large / Large Turbo: no dual attention, qk_norm "rms_norm", a 192 x 192 table.
//   3.0 Medium: neither (qk_norm null).
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

// The component's config.json. Absent keys (and those listed in "_use_default_values") take the defaults of
// diffusers' SD3Transformer2DModel.__init__; "out_channels": null means in_channels, "qk_norm": null none.
struct SD3TransformerConfig {
  int64_t sample_size = 128;
  int64_t patch_size = 2;
  int64_t in_channels = 16;
  int64_t num_layers = 18;
  int64_t attention_head_dim = 64;
  int64_t num_attention_heads = 18;
  int64_t joint_attention_dim = 4096;
  int64_t caption_projection_dim = 1152;
  int64_t pooled_projection_dim = 2048;
  int64_t out_channels = 16;
  int64_t pos_embed_max_size = 96;
  std::vector<int64_t> dual_attention_layers;  // blocks with the MMDiT-X second attention
  std::string qk_norm;                         // "" (none) or "rms_norm"

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  bool is_dual_attention_layer(int64_t block) const;

  // Reads the fields of a parsed config.json. A "_class_name" other than SD3Transformer2DModel is an error,
  // and so is any key this implementation does not know (it could change the architecture). The result is
  // validated.
  static SD3TransformerConfig from_config(const io::JsonConfig& config);
  static SD3TransformerConfig from_json(const std::string& text, const std::string& source = "config.json");
  // `path`: a config.json file, or a component folder holding one.
  static SD3TransformerConfig from_file(const std::string& path);

  // Throws kiln::Error naming `source` for values no SD3 model has (caption_projection_dim != inner_dim, an
  // unsupported qk_norm, dual attention indices outside the model, non-positive sizes, ...).
  void validate(const std::string& source = "config.json") const;
};

class SD3JointTransformerBlock;
class FluxTimeTextEmbedding;
class AdaLayerNormContinuous;

class SD3Transformer2DModel : public nn::Module {
 public:
  // Registers every parameter with its diffusers name and shape (nothing is allocated until load_weights).
  // The position table pos_embed.pos_embed [1, max * max, inner_dim] is a buffer stored in the checkpoint.
  // With `tp` (size > 1) this rank holds its shard of every block by the plan in models/dit_layers.h; the
  // context embedder, time/text embedders, norm_out and proj_out are split too; pos_embed (a small
  // convolution and the position table) is replicated. Every rank returns the full output.
  explicit SD3Transformer2DModel(const SD3TransformerConfig& config, const nn::TensorParallel& tp = {});
  ~SD3Transformer2DModel() override;

  // One denoising evaluation, as SD3Transformer2DModel.forward(return_dict=False)[0]:
  //   hidden [B, in_channels, H, W]        latents in the compute dtype (that of the loaded weights); H and W
  //                                         multiples of patch_size, at most pos_embed_max_size patches each
  //   encoder_hidden [B, L, joint_attention_dim], pooled [B, pooled_projection_dim]   same dtype
  //   timestep [B]                          the scheduler's timestep (0..1000, fractional), any floating
  //   dtype;
  //                                         the sinusoid reads it as float32, as diffusers does
  //   skip_layers                           block indices run as identity (skip-layer guidance)
  // -> [B, out_channels, H, W] in the compute dtype: the predicted flow velocity.
  Tensor forward(const Tensor& hidden, const Tensor& encoder_hidden, const Tensor& pooled,
                 const Tensor& timestep, const std::vector<int64_t>& skip_layers = {}) const;

  // Compiled mode (kiln/nn/compile.h): compile() compiles the whole forward per input shape (and skip list);
  // compile_repeated_blocks() compiles each distinct joint-block structure once, shared by its instances.
  bool supports_compile() const override { return true; }
  // The joint transformer_blocks.
  std::vector<nn::BlockList> repeated_blocks() const override;

  const SD3TransformerConfig& config() const { return config_; }
  // The compute dtype (that of the loaded weights).
  DType dtype() const;

  // diffusers' SD3Transformer2DModel.from_single_file: an SD3/SD3.5 transformer saved as one file in
  // Stability AI's layout, .safetensors or .gguf (kiln/models/sd3_single_file.h), described by `config` (a
  // config.json or a diffusers transformer/ folder holding one). Block-quantized GGUF weights of Linear
  // layers stay quantized in memory; everything else is converted to `dtype`.
  static std::unique_ptr<SD3Transformer2DModel> from_single_file(const std::string& path,
                                                                 const std::string& config, DType dtype);

 private:
  Tensor forward_eager(const Tensor& hidden, const Tensor& encoder_hidden, const Tensor& pooled,
                       const Tensor& timestep, const std::vector<int64_t>& skip_layers) const;
  // PatchEmbed: conv patches, flattened row-major, plus the centre crop of the stored position table.
  Tensor patch_embed(const Tensor& hidden) const;

  SD3TransformerConfig config_;
  nn::Conv2d pos_embed_proj_;
  Tensor pos_embed_table_;
  std::unique_ptr<FluxTimeTextEmbedding> time_text_embed_;
  nn::Linear context_embedder_;
  std::vector<std::unique_ptr<SD3JointTransformerBlock>> transformer_blocks_;
  std::unique_ptr<AdaLayerNormContinuous> norm_out_;
  nn::Linear proj_out_;
};

// Builds the model from `folder` (a diffusers transformer/ component: config.json and one or several
// safetensors files) and loads its weights converted to `dtype` (no copy when stored so).
// With `tp`, only this rank's slices are read from the files.
std::unique_ptr<SD3Transformer2DModel> load_sd3_transformer(const std::string& folder, DType dtype,
                                                            const nn::TensorParallel& tp = {});

}  // namespace kiln::models
