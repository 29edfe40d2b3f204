// The modules of diffusers' AutoencoderKLQwenImage (autoencoder_kl_qwenimage.py), under its parameter names,
// as they compute on a single frame. Activations are 2-D images [B, C, H, W]: the frame axis of diffusers'
// [B, C, T, H, W] is dropped, T being 1.
#pragma once

#include <memory>
#include <vector>

#include "kiln/families/qwen_image/autoencoder_kl_qwen_image.h"
#include "kiln/nn/layers.h"

namespace kiln::models::qwen_image_vae {

// QwenImageCausalConv3d with a cubic kernel k (3 with padding 1, or 1): weight [out, in, k, k, k]. diffusers
// pads the frame axis with 2 * padding zero frames in front (the first chunk has no cached frames), so the
// only output frame sees zeros under every temporal tap but the last: a 2-D convolution with
// weight[:, :, k - 1].
class CausalConv3d : public nn::Module {
 public:
  CausalConv3d(int64_t in, int64_t out, int64_t kernel);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;

 private:
  int64_t kernel_;
};

// A Resample's time_conv (QwenImageCausalConv3d with a (3, 1, 1) kernel). It mixes frames of later chunks
// only: on the first chunk diffusers' upsample3d and downsample3d skip it (they fill the feature cache), so
// its weights are loaded and checked but take no part in a single frame's result.
class TimeConv : public nn::Module {
 public:
  TimeConv(int64_t in, int64_t out);
  Tensor weight, bias;
};

// QwenImageRMS_norm (channel-first, no bias in any of this VAE's norms): F.normalize over the channels (x /
// max(||x||, 1e-12), in float32 for bfloat16/float16 inputs, rounded back to x's dtype), then * sqrt(C) and
// * gamma, each rounded to x's dtype. gamma is [C, 1, 1, 1] in the residual blocks and encoder/decoder
// heads, [C, 1, 1] in the attention block (`image_gamma`).
class RmsNorm : public nn::Module {
 public:
  RmsNorm(int64_t dim, bool image_gamma);
  Tensor forward(const Tensor& x) const;
  Tensor gamma;

 private:
  int64_t dim_;
};

// One entry of the encoder's flat down_blocks list: a residual block or a resampler.
class Layer : public nn::Module {
 public:
  virtual Tensor forward(Tensor x) const = 0;
};

// QwenImageResidualBlock: conv2(silu(norm2(conv1(silu(norm1(x)))))) + shortcut(x) (dropout is inactive).
class ResidualBlock : public Layer {
 public:
  ResidualBlock(int64_t in, int64_t out);
  Tensor forward(Tensor x) const override;
  RmsNorm norm1, norm2;
  CausalConv3d conv1, conv2;
  std::unique_ptr<CausalConv3d> conv_shortcut;
};

// QwenImageAttentionBlock: single-head self-attention over the h * w positions of the frame, 1x1 conv
// projections, residual.
class AttentionBlock : public nn::Module {
 public:
  explicit AttentionBlock(int64_t dim);
  Tensor forward(const Tensor& x) const;
  RmsNorm norm;
  nn::Conv2d to_qkv, proj;
};

// QwenImageResample for the modes this VAE builds: "downsample2d/3d" (zero row and column appended at the
// bottom and right, 3x3 conv with stride 2, dim -> dim) and "upsample2d/3d" (nearest 2x, 3x3 conv, dim -> dim
// / 2). The 3d modes add a time_conv, which a single frame does not run.
class Resample : public Layer {
 public:
  Resample(int64_t dim, bool upsample, bool temporal);
  Tensor forward(Tensor x) const override;
  nn::Conv2d conv;  // "resample.1"
  std::unique_ptr<TimeConv> time_conv;

 private:
  bool upsample_;
};

// QwenImageMidBlock with its one attention layer: resnets.0, attentions.0, resnets.1.
class MidBlock : public nn::Module {
 public:
  explicit MidBlock(int64_t dim);
  Tensor forward(Tensor x) const;
  ResidualBlock resnet0, resnet1;
  AttentionBlock attention;
};

// QwenImageEncoder3d: conv_in, the flat down_blocks list (num_res_blocks residual blocks per level, then the
// level's resampler but after the last), mid_block, norm_out + silu, conv_out to 2 * z_dim channels.
class Encoder : public nn::Module {
 public:
  explicit Encoder(const AutoencoderKLQwenImageConfig& c);
  Tensor forward(Tensor x) const;
  CausalConv3d conv_in;
  std::vector<std::unique_ptr<Layer>> down_blocks;
  std::unique_ptr<MidBlock> mid_block;
  std::unique_ptr<RmsNorm> norm_out;
  std::unique_ptr<CausalConv3d> conv_out;
};

// QwenImageUpBlock: num_res_blocks + 1 residual blocks, then the upsampler (upsamplers.0) but on the last.
class UpBlock : public nn::Module {
 public:
  UpBlock(int64_t in, int64_t out, int64_t num_res_blocks, bool upsample, bool temporal);
  Tensor forward(Tensor x) const;
  std::vector<std::unique_ptr<ResidualBlock>> resnets;
  std::unique_ptr<Resample> upsampler;
};

// QwenImageDecoder3d: conv_in, mid_block, up_blocks, norm_out + silu, conv_out to input_channels.
class Decoder : public nn::Module {
 public:
  explicit Decoder(const AutoencoderKLQwenImageConfig& c);
  Tensor forward(Tensor x) const;
  std::unique_ptr<CausalConv3d> conv_in;
  std::unique_ptr<MidBlock> mid_block;
  std::vector<std::unique_ptr<UpBlock>> up_blocks;
  std::unique_ptr<RmsNorm> norm_out;
  std::unique_ptr<CausalConv3d> conv_out;
};

}  // namespace kiln::models::qwen_image_vae

namespace kiln::models {

struct AutoencoderKLQwenImage::Layers {
  explicit Layers(const AutoencoderKLQwenImageConfig& c);
  qwen_image_vae::Encoder encoder;
  qwen_image_vae::CausalConv3d quant_conv, post_quant_conv;
  qwen_image_vae::Decoder decoder;
};

}  // namespace kiln::models
