// diffusers' AutoencoderKL (the FLUX.1 and SD3 VAEs): encoder to a diagonal Gaussian latent, decoder back to
// pixels. Sizes all come from the component's config.json.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/nn/layers.h"

namespace kiln::models {

struct AutoencoderKLConfig {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  int64_t latent_channels = 4;
  std::vector<int64_t> block_out_channels = {64};
  int64_t layers_per_block = 1;
  int64_t norm_num_groups = 32;
  bool mid_block_add_attention = true;
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  double scaling_factor = 0.18215;
  double shift_factor = 0.0;  // absent (null) in SD1/SDXL configs: 0

  static AutoencoderKLConfig from_file(const std::string& config_json);
  // Pixels per latent pixel: 2^(number of blocks - 1).
  int64_t scale_factor() const { return int64_t{1} << (block_out_channels.size() - 1); }
};

class AutoencoderKL : public nn::Module {
 public:
  explicit AutoencoderKL(const AutoencoderKLConfig& config);
  // z [B, latent_channels, h, w] (already unscaled: z / scaling_factor + shift_factor) -> image [B, out, 8h,
  // 8w] in [-1, 1] (not clamped), in z's dtype.
  Tensor decode(const Tensor& z) const;
  // image [B, in, H, W] in [-1, 1] -> the latent distribution's mean and log-variance [B, latent, H/8, W/8].
  struct LatentDistribution {
    Tensor mean, logvar;
  };
  LatentDistribution encode(const Tensor& image) const;
  const AutoencoderKLConfig& config() const { return config_; }

  struct ResnetBlock : nn::Module {
    ResnetBlock(int64_t in, int64_t out, int64_t groups);
    Tensor forward(const Tensor& x) const;
    nn::GroupNorm norm1, norm2;
    nn::Conv2d conv1, conv2;
    std::optional<nn::Conv2d> conv_shortcut;
  };
  struct MidAttention : nn::Module {
    MidAttention(int64_t channels, int64_t groups);
    Tensor forward(const Tensor& x) const;
    nn::GroupNorm group_norm;
    nn::Linear to_q, to_k, to_v, to_out;
  };
  struct MidBlock : nn::Module {
    MidBlock(int64_t channels, int64_t groups, bool with_attention);
    Tensor forward(const Tensor& x) const;
    ResnetBlock resnet0, resnet1;
    std::optional<MidAttention> attention;
  };
  struct Stage : nn::Module {  // one DownEncoderBlock2D or UpDecoderBlock2D
    std::vector<std::unique_ptr<ResnetBlock>> resnets;
    std::optional<nn::Conv2d> resample;  // downsampler (3x3 stride 2) or upsampler (3x3 after nearest x2)
  };

 private:
  AutoencoderKLConfig config_;
  // encoder
  nn::Conv2d enc_conv_in_;
  std::vector<std::unique_ptr<Stage>> down_;
  MidBlock enc_mid_;
  nn::GroupNorm enc_norm_out_;
  nn::Conv2d enc_conv_out_;
  std::optional<nn::Conv2d> quant_conv_;
  // decoder
  std::optional<nn::Conv2d> post_quant_conv_;
  nn::Conv2d dec_conv_in_;
  MidBlock dec_mid_;
  std::vector<std::unique_ptr<Stage>> up_;
  nn::GroupNorm dec_norm_out_;
  nn::Conv2d dec_conv_out_;
};

// Reads `folder`/config.json and the weights (encoder and decoder), converted to `dtype`.
std::unique_ptr<AutoencoderKL> load_autoencoder_kl(const std::string& folder, DType dtype);

}  // namespace kiln::models
