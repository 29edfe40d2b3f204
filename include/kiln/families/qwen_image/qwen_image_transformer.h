// QwenImageTransformer2DModel (Qwen-Image, Qwen-Image-Edit, -Edit-2509; with zero_cond_t, -Edit-2511), the
// denoiser of diffusers' QwenImage pipelines: a dual-stream MMDiT. The packed latents (img_in) and the
// RMSNorm'd text features (txt_norm, txt_in) each keep their own stream through every block (own modulation,
// LayerNorms, q/k/v and output projections, feed-forward) and meet in one joint attention over
// [text | image], the text's padding keys masked. Positions: 3-axis RoPE on interleaved pairs; each image's
// patches are centred on the grid (scale_rope), its frame axis the image's index; the text's tokens follow
// the images' largest half-side on every axis. Parameter names are diffusers', so a diffusers `transformer/`
// folder loads by name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/io/json_config.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/module.h"
#include "kiln/nn/step_cache.h"

namespace kiln::models {

// The component's config.json. Absent keys take the defaults of diffusers' __init__ (Qwen-Image's values);
// "out_channels": null means in_channels.
struct QwenImageTransformerConfig {
  int64_t patch_size = 2, in_channels = 64, out_channels = 16, num_layers = 60, attention_head_dim = 128,
          num_attention_heads = 24, joint_attention_dim = 3584;
  bool guidance_embeds = false;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};
  // Qwen-Image-Edit-2511: the tokens after the first img_shapes entry (the input images) are modulated by the
  // embedding of t = 0, the noise's by t's; the text and norm_out by t's.
  bool zero_cond_t = false;

  // The model width (num_attention_heads * attention_head_dim).
  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }

  // Reads a parsed config.json: "_class_name" must be QwenImageTransformer2DModel, a key this implementation
  // does not know is an error, and the flags of the variants Kiln does not run (use_additional_t_cond,
  // use_layer3d_rope: Qwen-Image-Layered; guidance_embeds) are refused by name.
  static QwenImageTransformerConfig from_config(const io::JsonConfig& config);
  static QwenImageTransformerConfig from_json(const std::string& text,
                                              const std::string& source = "config.json");
  // `folder_or_config_json`: a config.json file, or a component folder holding one.
  static QwenImageTransformerConfig from_file(const std::string& folder_or_config_json);
  // Throws kiln::Error naming `source` for values that cannot describe a model Kiln runs.
  void validate(const std::string& source = "config.json") const;
};

// One image's latent grid, as diffusers' img_shapes entries: (frames, height/2, width/2) in patches.
struct QwenImageShape {
  int64_t frames = 1, height = 0, width = 0;
};

class QwenTimestepEmbedding;
class QwenImageTransformerBlock;
class AdaLayerNormContinuous;

class QwenImageTransformer2DModel : public nn::Module {
 public:
  // Every parameter under its diffusers name and shape (nothing allocated until load_weights). With `tp`
  // (size > 1), diffusers' _tp_plan: each block's q/k/v (both streams) and feed-forward inputs column-
  // parallel, to_out.0 / to_add_out and the feed-forwards' outputs row-parallel (each rank attends over its
  // own heads); the modulations, embedders, norm_out and proj_out column-parallel and gathered. Every rank
  // returns the full output. A degree that does not divide num_attention_heads is refused by name.
  explicit QwenImageTransformer2DModel(const QwenImageTransformerConfig& config,
                                       const nn::TensorParallel& tp = {});
  ~QwenImageTransformer2DModel() override;

  const QwenImageTransformerConfig& config() const { return config_; }

  // One denoising evaluation, as QwenImageTransformer2DModel.forward(return_dict=False)[0]:
  //   hidden_states [B, L, in_channels]   packed latents in the compute dtype (the weights'); L = the sum of
  //                                       img_shapes' frames * height * width, the images in that order
  //   encoder_hidden_states [B, S, joint_attention_dim]   same dtype
  //   encoder_mask [B, S]                 int64 (or any integer/bool dtype), nonzero = a prompt token, zero =
  //                                       padding no query attends to; undefined: every token valid
  //   timestep [B]                        float, t / 1000 as the pipeline passes it (cast to the compute
  //   dtype
  //                                       and scaled by 1000 inside, as diffusers does)
  //   img_shapes                          the grids every sample shares (the Edit pipelines: the noise's,
  //   then
  //                                       each input image's)
  // -> [B, L, patch_size^2 * out_channels] in the compute dtype.
  Tensor forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states, const Tensor& encoder_mask,
                 const Tensor& timestep, const std::vector<QwenImageShape>& img_shapes) const;

  // Compiled mode (kiln/nn/compile.h): compile() compiles the whole forward per input shape (the RoPE tables
  // are inputs, so grids of the same token count do not share a program wrongly); compile_repeated_blocks()
  // one block program shared by all the transformer_blocks.
  bool supports_compile() const override { return true; }
  // The transformer_blocks.
  std::vector<nn::BlockList> repeated_blocks() const override;
  // Step caching (kiln/nn/step_cache.h): the transformer_blocks, image and text streams; TaylorSeer forecasts
  // each block's attention.
  nn::StepCache* step_cache() const override { return &step_cache_; }

 private:
  Tensor forward_eager(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                       const Tensor& encoder_mask, const Tensor& timestep, const Tensor& rope_cos,
                       const Tensor& rope_sin, const Tensor& reference) const;

  mutable nn::StepCache step_cache_;  // a call's state; calls to a pipeline are served one at a time
  QwenImageTransformerConfig config_;
  std::unique_ptr<QwenTimestepEmbedding> time_text_embed_;
  nn::RMSNorm txt_norm_;
  nn::Linear img_in_, txt_in_;
  std::vector<std::unique_ptr<QwenImageTransformerBlock>> transformer_blocks_;
  std::unique_ptr<AdaLayerNormContinuous> norm_out_;
  nn::Linear proj_out_;
};

// The model of `folder` (a diffusers transformer/ component: config.json and one or several safetensors
// files) with its weights in `dtype`; strict: every tensor used, names and shapes checked. With `tp`, this
// rank's slices only.
std::unique_ptr<QwenImageTransformer2DModel> load_qwen_image_transformer(const std::string& folder,
                                                                         DType dtype,
                                                                         const nn::TensorParallel& tp = {});

}  // namespace kiln::models
