// UNet2DConditionModel: the denoiser of Stable Diffusion 1.x/2.x and SDXL (diffusers' UNet2DConditionModel
// with the blocks those checkpoints use). A convolutional U: conv_in, down blocks of ResNet blocks
// (GroupNorm, SiLU, 3x3 convolutions, the time embedding added between them) and, in the CrossAttn blocks,
// spatial transformers (self-attention over the pixels, cross-attention to the prompt's tokens, a GEGLU
// feed-forward), each level halving the size; a middle block; up blocks that concatenate the down path's
// outputs (the skip connections) and double the size back; GroupNorm, SiLU, conv_out. SDXL adds its
// micro-conditioning: the pooled prompt and six size numbers (original size, crop corner, target size)
// embedded beside the time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/io/json_config.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/module.h"
#include "kiln/nn/tensor_parallel.h"

namespace kiln::models {

// The component's config.json, one value per block where diffusers allows an int or a list. Absent keys take
// diffusers' defaults (SD1.x's UNet); arguments that select blocks or embeddings Kiln does not have
// (class embeddings, encoder_hid_proj, LCM's time_cond_proj_dim, ...) are refused by name.
struct UNet2DConditionConfig {
  int64_t sample_size = 64;
  int64_t in_channels = 4;
  int64_t out_channels = 4;
  bool flip_sin_to_cos = true;
  int64_t freq_shift = 0;
  std::vector<std::string> down_block_types = {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                               "CrossAttnDownBlock2D", "DownBlock2D"};
  std::string mid_block_type = "UNetMidBlock2DCrossAttn";
  std::vector<std::string> up_block_types = {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                                             "CrossAttnUpBlock2D"};
  std::vector<int64_t> block_out_channels = {320, 640, 1280, 1280};
  std::vector<int64_t> layers_per_block;  // per down block (the up blocks run one more each)
  int64_t downsample_padding = 1;
  double mid_block_scale_factor = 1.0;
  int64_t norm_num_groups = 32;
  double norm_eps = 1e-5;
  int64_t cross_attention_dim = 1280;
  std::vector<int64_t> transformer_layers_per_block;  // per down block; the up blocks run them reversed
  std::vector<int64_t> num_attention_heads;           // per down block (diffusers' attention_head_dim when
                                                      // num_attention_heads is unset: the legacy naming)
  bool use_linear_projection = false;
  bool upcast_attention = false;
  // SDXL: "text_time" adds add_embedding(concat(text_embeds, sinusoid(time_ids))) to the time embedding.
  std::string addition_embed_type;  // "" or "text_time"
  int64_t addition_time_embed_dim = 0;
  int64_t projection_class_embeddings_input_dim = 0;

  // The time embedding's width: block_out_channels[0] * 4.
  int64_t time_embed_dim() const { return block_out_channels.front() * 4; }
  bool text_time() const { return addition_embed_type == "text_time"; }
  // Pixels of latent per pixel of the smallest level: 2^(number of downsampling blocks).
  int64_t downsampling() const { return int64_t{1} << (down_block_types.size() - 1); }

  static UNet2DConditionConfig from_config(const io::JsonConfig& config);
  static UNet2DConditionConfig from_json(const std::string& text, const std::string& source = "config.json");
  // `path`: a config.json file, or a component folder holding one.
  static UNet2DConditionConfig from_file(const std::string& path);
  void validate(const std::string& source = "config.json") const;
};

// SDXL's added conditions for one call: the pooled prompt embedding of the second text encoder [B, P] and
// the time ids [B, 6] (original height, width, crop top, left, target height, width), float32.
struct UNetAddedConditions {
  Tensor text_embeds;
  Tensor time_ids;
};

class UNetDownBlock;
class UNetMidBlock;
class UNetUpBlock;

class UNet2DConditionModel : public nn::Module {
 public:
  // With `tp` (tensor parallelism), this rank holds its share of every transformer block's attention heads
  // and feed-forward width; the ResNets, samplers, spatial transformers' norms and projections, and the
  // embeddings run whole on every rank.
  explicit UNet2DConditionModel(const UNet2DConditionConfig& config, const nn::TensorParallel& tp = {});
  ~UNet2DConditionModel() override;

  // One evaluation, as UNet2DConditionModel.forward(sample, timestep, encoder_hidden_states,
  // added_cond_kwargs).sample:
  //   sample [B, in_channels, h, w]                 in the compute dtype (the weights'); any h, w >= 1
  //   timestep [B] (or [1], broadcast)              the scheduler's t, read as float32 by the sinusoid
  //   encoder_hidden_states [B, S, cross_dim]       the prompt's tokens, in the compute dtype
  //   added                                         SDXL's conditions (required iff addition_embed_type)
  // -> [B, out_channels, h, w] in the compute dtype.
  Tensor forward(const Tensor& sample, const Tensor& timestep, const Tensor& encoder_hidden_states,
                 const UNetAddedConditions& added = {}) const;

  // The embedding every ResNet block gets (before its SiLU): time_embedding(sinusoid(t)) plus, for SDXL,
  // add_embedding(concat(text_embeds, sinusoid(time_ids))) [B, time_embed_dim], in the compute dtype.
  Tensor time_embedding(const Tensor& timestep, int64_t batch, const UNetAddedConditions& added) const;

  // What forward computes with the intermediate tensors kept (diffusers' down_block_res_samples and the
  // middle block's output), for tests that compare stage by stage.
  struct Trace {
    Tensor temb;
    std::vector<Tensor> down_block_res_samples;
    Tensor mid_block_out;
    Tensor out;
  };
  Trace forward_traced(const Tensor& sample, const Tensor& timestep, const Tensor& encoder_hidden_states,
                       const UNetAddedConditions& added = {}) const;

  const UNet2DConditionConfig& config() const { return config_; }
  DType dtype() const { return conv_in_.weight.dtype(); }

  // compile(): the whole UNet as one program per input signature (static shapes). Its repeated blocks, in the
  // order they run: "resnets" (every ResnetBlock2D) and "transformer_blocks" (every BasicTransformerBlock) —
  // what compile_repeated_blocks() compiles (a program per distinct shape) and group offload streams.
  bool supports_compile() const override { return true; }
  std::vector<nn::BlockList> repeated_blocks() const override;

 private:
  Tensor run(const Tensor& sample, const Tensor& timestep, const Tensor& encoder_hidden_states,
             const UNetAddedConditions& added, Trace* trace) const;

  UNet2DConditionConfig config_;
  nn::Conv2d conv_in_;
  nn::Linear time_linear_1_, time_linear_2_;
  std::unique_ptr<nn::Linear> add_linear_1_, add_linear_2_;
  std::vector<std::unique_ptr<UNetDownBlock>> down_blocks_;
  std::unique_ptr<UNetMidBlock> mid_block_;
  std::vector<std::unique_ptr<UNetUpBlock>> up_blocks_;
  nn::GroupNorm conv_norm_out_;
  nn::Conv2d conv_out_;
};

// The model of `folder` (a diffusers unet/ component) with its weights in `dtype`.
std::unique_ptr<UNet2DConditionModel> load_unet_2d_condition(const std::string& folder, DType dtype,
                                                             const nn::TensorParallel& tp = {});

}  // namespace kiln::models
