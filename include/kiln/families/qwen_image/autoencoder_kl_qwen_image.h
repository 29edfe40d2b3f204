// diffusers' AutoencoderKLQwenImage (Qwen-Image's VAE: the Wan 2.1 causal 3-D VAE), run on single images.
// On one frame (T = 1, the only case Kiln runs) every causal 3-D convolution sees its input behind two zero
// frames of causal padding, so it is the 2-D convolution with the kernel's last temporal slice; the
// resamplers' time_conv, which only mixes frames, is not run on the first (and only) chunk. The weights are
// still the checkpoint's 3-D ones, loaded and checked by name and shape.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/models/latent_codec.h"
#include "kiln/nn/module.h"

namespace kiln::models {

// vae/config.json. Values that change the math and that Kiln does not run (attention inside the encoder's
// levels: a non-empty attn_scales) are refused by name.
struct AutoencoderKLQwenImageConfig {
  int64_t base_dim = 96;
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<double> attn_scales;                              // must be empty
  std::vector<bool> temperal_downsample = {false, true, true};  // diffusers' spelling; len(dim_mult) - 1
  double dropout = 0.0;                                         // inactive at inference
  int64_t input_channels = 3;
  std::vector<double> latents_mean, latents_std;  // z_dim values each

  static AutoencoderKLQwenImageConfig from_file(const std::string& config_json);
  // Parses config.json's text; `origin` names it in errors.
  static AutoencoderKLQwenImageConfig from_json(const std::string& text,
                                                const std::string& origin = "config.json");
  // Pixels per latent pixel: 2 ** len(temperal_downsample) (8 for Qwen-Image).
  int64_t scale_factor() const { return int64_t{1} << temperal_downsample.size(); }
};

// diffusers' AutoencoderKLQwenImage.enable_tiling arguments (pixels; its defaults). Tiles of tile_sample_min
// pixels (tile_sample_min / 8 latents) start every tile_sample_stride pixels; each decoded tile fades into
// its upper and left neighbours over min - stride pixels (encoded: latents) and contributes its first stride
// pixels (latents) of rows and columns. Sizes and strides must be multiples of scale_factor(), each stride
// at most its size.
struct AutoencoderKLQwenImageTiling {
  int64_t tile_sample_min_height = 256, tile_sample_min_width = 256;
  int64_t tile_sample_stride_height = 192, tile_sample_stride_width = 192;
};

// As a LatentCodec: latents [B, z_dim, H / 8, W / 8], normalised per channel as the Qwen-Image pipelines do:
// to_latents(z) = (z - latents_mean) * (1 / latents_std), from_latents(x) = x / (1 / latents_std) +
// latents_mean, with mean and 1 / std (computed in float32) rounded to the latents' dtype first.
class AutoencoderKLQwenImage : public nn::Module, public LatentCodec {
 public:
  explicit AutoencoderKLQwenImage(const AutoencoderKLQwenImageConfig& config);
  ~AutoencoderKLQwenImage() override;
  const AutoencoderKLQwenImageConfig& config() const { return config_; }

  // ---- LatentCodec
  int64_t pixels_per_latent() const override { return config_.scale_factor(); }
  Shape latent_shape(int64_t batch, int64_t height, int64_t width) const override;
  // images [B, input_channels, H, W] (one frame each; H and W multiples of scale_factor()) -> the posterior's
  // mean and log-variance (clamped to [-30, 20]) [B, z_dim, H / 8, W / 8]. A 5-D input is accepted only with
  // a single frame.
  LatentDistribution encode(const Tensor& images) const override;
  Tensor to_latents(const Tensor& vae_latents) const override;
  Tensor from_latents(const Tensor& latents) const override;
  // z [B, z_dim, h, w] (or [B, z_dim, 1, h, w]) -> images [B, input_channels, 8h, 8w] in z's dtype (computed
  // in the weights'), CLAMPED to [-1, 1]: unlike AutoencoderKL's, diffusers' AutoencoderKLQwenImage.decode
  // clamps its output (but for a tiled decode, below).
  Tensor decode(const Tensor& vae_latents) const override;
  // A tile size: enable_tiling with square tiles of that many pixels (0: diffusers' 256) and a stride of
  // three quarters of it (diffusers' 192 / 256) rounded down to a multiple of 8; nullopt: disable_tiling().
  void set_tiling(std::optional<int64_t> tile_size) override;

  // diffusers' enable_tiling / disable_tiling: from now on decode() runs tiled_decode() when the latents are
  // larger than a tile's latents in either dimension, and encode() runs tiled_encode() when the image is
  // larger than a tile. As in diffusers, a tiled decode is NOT clamped (diffusers' _decode returns
  // tiled_decode's result before its clamp). Throws kiln::Error naming the value for sizes that cannot tile.
  void enable_tiling(const AutoencoderKLQwenImageTiling& tiling = {});
  void disable_tiling() { tiling_.reset(); }
  const std::optional<AutoencoderKLQwenImageTiling>& tiling() const { return tiling_; }

  struct Layers;  // the encoder's and decoder's modules (src/families/qwen_image/qwen_image_vae_layers.h)

 private:
  Tensor frame_of(const Tensor& x, const char* op, int64_t channels) const;
  Tensor decoder_forward(const Tensor& z) const;  // post_quant_conv + decoder, not clamped
  Tensor encoder_forward(const Tensor& x) const;  // encoder + quant_conv: the moments [B, 2 z_dim, h, w]
  Tensor tiled_decode(const Tensor& z) const;
  Tensor tiled_encode(const Tensor& x) const;

  AutoencoderKLQwenImageConfig config_;
  std::unique_ptr<Layers> layers_;
  std::optional<AutoencoderKLQwenImageTiling> tiling_;
};

// Reads `folder`/config.json and `folder`'s safetensors, converted to `dtype`. Strict: every tensor of the
// checkpoint must be one of the model's, with its shape, and every one of the model's must be present; the
// error names the tensor.
std::unique_ptr<AutoencoderKLQwenImage> load_autoencoder_kl_qwen_image(const std::string& folder,
                                                                       DType dtype);

}  // namespace kiln::models
