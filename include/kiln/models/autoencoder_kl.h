// diffusers' AutoencoderKL (the FLUX.1 and SD3 VAEs) and the convolutional part of AutoencoderKLFlux2
// (FLUX.2): encoder to a diagonal Gaussian latent, decoder back to pixels. Sizes all come from the
// component's config.json.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/models/latent_codec.h"
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
  int64_t sample_size = 32;  // pixels; the default tile size of tiled decode/encode (1024 for FLUX.1 and SD3)
  // AutoencoderKLFlux2 (config "_class_name"): the decoder's own block widths (empty: block_out_channels),
  // and the BatchNorm statistics of the 2x2-patchified latents (kiln/models/autoencoder_kl_flux2.h).
  bool flux2 = false;
  std::vector<int64_t> decoder_block_out_channels;
  double batch_norm_eps = 1e-4;
  std::vector<int64_t> patch_size = {2, 2};

  static AutoencoderKLConfig from_file(const std::string& config_json);
  // Pixels per latent pixel: 2^(number of blocks - 1).
  int64_t scale_factor() const { return int64_t{1} << (block_out_channels.size() - 1); }
  // The decoder's block widths.
  const std::vector<int64_t>& decoder_channels() const {
    return decoder_block_out_channels.empty() ? block_out_channels : decoder_block_out_channels;
  }
};

// diffusers' AutoencoderKL tiling attributes (enable_tiling, then tile_sample_min_size / tile_latent_min_size
// / tile_overlap_factor). Tiles of tile_latent_min_size latents start every int(tile_latent_min_size * (1 -
// overlap)) latents; each decoded tile fades into its upper and left neighbours over int(tile_sample_min_size
// * overlap) pixels (diffusers' blend_v/blend_h) and contributes its first tile_sample_min_size - that many
// pixels of rows and columns. Encoding is the mirror image. Only the tile sizes bound memory: a 1024x1024
// decode with 512-pixel tiles needs about a quarter of an untiled one.
struct AutoencoderKLTiling {
  int64_t tile_sample_min_size = 0;  // pixels; 0: the config's sample_size
  int64_t tile_latent_min_size = 0;  // latents; 0: int(tile_sample_min_size / scale factor), as diffusers
  double tile_overlap_factor = 0.25;
};

// As a LatentCodec: its latents normalised as (z - shift_factor) * scaling_factor (the FLUX.1 and SD3
// pipelines'), [B, latent_channels, H / 8, W / 8].
class AutoencoderKL : public nn::Module, public LatentCodec {
 public:
  explicit AutoencoderKL(const AutoencoderKLConfig& config);
  // z [B, latent_channels, h, w] (already unscaled: z / scaling_factor + shift_factor) -> image [B, out, 8h,
  // 8w] in [-1, 1] (not clamped), in z's dtype.
  Tensor decode(const Tensor& z) const override;
  // image [B, in, H, W] in [-1, 1] -> the latent distribution's mean and log-variance [B, latent, H/8, W/8].
  using LatentDistribution = models::LatentDistribution;
  LatentDistribution encode(const Tensor& image) const override;
  const AutoencoderKLConfig& config() const { return config_; }

  // ---- LatentCodec
  int64_t pixels_per_latent() const override { return config_.scale_factor(); }
  Shape latent_shape(int64_t batch, int64_t height, int64_t width) const override;
  // (z - shift_factor) * scaling_factor in z's dtype, and z / scaling_factor + shift_factor (diffusers').
  Tensor to_latents(const Tensor& vae_latents) const override;
  Tensor from_latents(const Tensor& latents) const override;
  void set_tiling(std::optional<int64_t> tile_size) override;

  // Tiling (diffusers' enable_tiling): from now on decode() runs tiled_decode() when the latent is larger
  // than a tile in either dimension, and encode() runs tiled_encode() when the image is larger than a tile.
  // Zero sizes in `options` take diffusers' defaults from the config; throws kiln::Error for sizes that
  // cannot tile.
  void enable_tiling(const AutoencoderKLTiling& options = {});
  void disable_tiling() { use_tiling_ = false; }
  bool use_tiling() const { return use_tiling_; }
  // The tile sizes in effect (defaults resolved), whether tiling is on or not.
  const AutoencoderKLTiling& tiling() const { return tiling_; }
  // diffusers' tiled_decode / _tiled_encode, whatever the input size (one tile when it fits in one).
  Tensor tiled_decode(const Tensor& z) const;
  LatentDistribution tiled_encode(const Tensor& image) const;

  // Stride-1 convolutions whose input (after the SiLU or 2x upsampling feeding them) exceeds this many bytes
  // run over bands of output rows, each band's input about this size: at 1024x1024 the full-image input of
  // such a conv, and oneDNN's channel-blocked copies of its input and output, would each take up to 1 GiB in
  // float32. Costs two recomputed rows per band (about 3% of the conv at 64 MiB bands of 1024-wide float32
  // rows). 0 turns banding off. Default 64 MiB.
  void set_conv_band_bytes(int64_t bytes);
  int64_t conv_band_bytes() const { return conv_band_bytes_; }

  // encoder.down_blocks and decoder.up_blocks, the stages group offload streams. The mid blocks are not
  // declared: they run once between the two lists, and their weights stay while the VAE runs.
  std::vector<nn::BlockList> repeated_blocks() const override;

  struct ResnetBlock : nn::Module {
    ResnetBlock(int64_t in, int64_t out, int64_t groups);
    // Takes x by value so that a moved-in activation is freed as soon as it has been normalised.
    Tensor forward(Tensor x, int64_t conv_band_bytes = 0) const;
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
    Tensor forward(Tensor x, int64_t conv_band_bytes = 0) const;
    ResnetBlock resnet0, resnet1;
    std::optional<MidAttention> attention;
  };
  struct Stage : nn::Module {  // one DownEncoderBlock2D or UpDecoderBlock2D
    // `layers` resnets ("resnets.<j>"), the first from `in` channels, the others from `out`.
    Stage(int64_t in, int64_t out, int64_t layers, int64_t groups);
    // The 3x3 resampler of `channels` channels, registered as `name` ("downsamplers.0.conv").
    void add_resample(const std::string& name, int64_t channels, int64_t stride, int64_t padding);
    std::vector<std::unique_ptr<ResnetBlock>> resnets;
    std::optional<nn::Conv2d> resample;  // downsampler (3x3 stride 2) or upsampler (3x3 after nearest x2)
  };

 private:
  Tensor decoder_forward(const Tensor& z) const;  // post_quant_conv + decoder
  Tensor encoder_forward(const Tensor& x) const;  // encoder + quant_conv: the moments [B, 2 latent, h, w]
  LatentDistribution split_moments(const Tensor& moments) const;

  AutoencoderKLConfig config_;
  AutoencoderKLTiling tiling_;
  bool use_tiling_ = false;
  int64_t conv_band_bytes_ = int64_t{64} << 20;
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
// `weights`: the weights from elsewhere instead of the folder's (a single file's view, under diffusers'
// names).
std::unique_ptr<AutoencoderKL> load_autoencoder_kl(const std::string& folder, DType dtype,
                                                   const nn::WeightSource* weights = nullptr);

}  // namespace kiln::models
