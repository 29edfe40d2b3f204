// The vision tower of Qwen2.5-VL (transformers' Qwen2_5_VisionTransformerPretrainedModel), as
// Qwen-Image-Edit's prompt encoding runs it on the input images: patches embedded by a matmul (the
// checkpoint's bias-free Conv3d over temporal x patch x patch), 2-D rotary embeddings over each image's patch
// grid, pre-norm blocks (RMSNorm, attention within windows of window_size pixels except the
// fullatt_block_indexes blocks, which attend over the whole image; a SwiGLU MLP with biases), then the patch
// merger (RMSNorm, the spatial_merge_size^2 neighbouring patches concatenated, Linear-GELU-Linear to
// out_hidden_size). The sequence runs in window order (groups of merged patches) and the merged output is put
// back in the processor's order.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/nn/layers.h"

namespace kiln::models {

struct Qwen2_5_VLVisionConfig {
  int64_t depth = 32;
  int64_t hidden_size = 1280;
  int64_t intermediate_size = 3420;
  int64_t num_heads = 16;
  int64_t in_channels = 3;
  int64_t out_hidden_size = 3584;
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;
  int64_t window_size = 112;  // pixels
  std::vector<int64_t> fullatt_block_indexes = {7, 15, 23, 31};
  double rope_theta = 10000.0;

  int64_t head_dim() const { return hidden_size / num_heads; }
  // Values of one patch as the processor flattens it: in_channels * temporal_patch_size * patch_size^2.
  int64_t patch_values() const { return in_channels * temporal_patch_size * patch_size * patch_size; }

  // The vision_config of a Qwen2_5_VLConfig (the text encoder's config.json, as transformers 4 or 5 wrote
  // it).
  static Qwen2_5_VLVisionConfig from_file(const std::string& config_json);
};

// One image's grid in patches, as the processor's image_grid_thw.
struct ImageGrid {
  int64_t t = 1, h = 0, w = 0;
  int64_t patches() const { return t * h * w; }
};

class Qwen2_5_VLVisionModel : public nn::Module {
 public:
  explicit Qwen2_5_VLVisionModel(const Qwen2_5_VLVisionConfig& config);

  // pixel_values [N, patch_values()] (the processor's rows, every image's in order; N the sum of the grids'
  // patches) -> the merged patch embeddings [N / spatial_merge_size^2, out_hidden_size], image after image
  // (transformers' get_image_features, concatenated), in the weights' dtype.
  Tensor forward(const Tensor& pixel_values, const std::vector<ImageGrid>& grids) const;

  const Qwen2_5_VLVisionConfig& config() const { return config_; }

 private:
  struct Block : nn::Module {
    explicit Block(const Qwen2_5_VLVisionConfig& c);
    // x [S, hidden] in window order; `segments` the attention groups' lengths (windows or whole images).
    Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin,
                   const std::vector<int64_t>& segments) const;
    int64_t heads, head_dim;
    nn::RMSNorm norm1, norm2;
    nn::Linear qkv, proj;
    nn::Linear gate_proj, up_proj, down_proj;
  };

  Qwen2_5_VLVisionConfig config_;
  Tensor patch_weight_;  // patch_embed.proj.weight [hidden, C, T, P, P]
  std::vector<std::unique_ptr<Block>> blocks_;
  nn::RMSNorm ln_q_;
  nn::Linear merger_fc1_, merger_fc2_;
};

// Loads the vision tower of a Qwen2_5_VLForConditionalGeneration text_encoder folder (config.json and
// safetensors): visual.* as save_pretrained writes it, or model.visual.* (the module tree's names); the
// language model and lm_head are not read. Every visual tensor must be there with its shape.
std::unique_ptr<Qwen2_5_VLVisionModel> load_qwen2_5_vl_vision(const std::string& text_encoder_folder,
                                                              DType dtype);
// The same from any weight source (`config` read by the caller).
std::unique_ptr<Qwen2_5_VLVisionModel> load_qwen2_5_vl_vision(const Qwen2_5_VLVisionConfig& config,
                                                              const nn::WeightSource& weights, DType dtype);

}  // namespace kiln::models
