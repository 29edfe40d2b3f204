#include "kiln/families/qwen_image/autoencoder_kl_qwen_image.h"

#include "families/qwen_image/qwen_image_vae_layers.h"
#include "families/qwen_image/qwen_image_vae_tiling.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/ops.h"

namespace kiln::models {

AutoencoderKLQwenImage::AutoencoderKLQwenImage(const AutoencoderKLQwenImageConfig& config)
    : config_(config), layers_(std::make_unique<Layers>(config)) {
  register_module("encoder", &layers_->encoder);
  register_module("quant_conv", &layers_->quant_conv);
  register_module("post_quant_conv", &layers_->post_quant_conv);
  register_module("decoder", &layers_->decoder);
}

AutoencoderKLQwenImage::~AutoencoderKLQwenImage() = default;

Shape AutoencoderKLQwenImage::latent_shape(int64_t batch, int64_t height, int64_t width) const {
  const int64_t f = config_.scale_factor();
  return {batch, config_.z_dim, height / f, width / f};
}

// [B, C, H, W], or diffusers' [B, C, 1, H, W], on the weights' device and in their dtype.
Tensor AutoencoderKLQwenImage::frame_of(const Tensor& x, const char* op, int64_t channels) const {
  KILN_CHECK(x.defined(), "AutoencoderKLQwenImage." << op << ": undefined input");
  Tensor frame = x;
  if (x.dim() == 5) {
    KILN_CHECK(x.size(2) == 1, "AutoencoderKLQwenImage."
                                   << op << ": got " << x.size(2) << " frames " << shape_str(x.shape())
                                   << "; Kiln runs this VAE on single images only (T = 1)");
    frame = x.select(2, 0);
  }
  KILN_CHECK(frame.dim() == 4 && frame.size(1) == channels,
             "AutoencoderKLQwenImage." << op << ": expected [B, " << channels << ", H, W] (or [B, "
                                       << channels << ", 1, H, W]), got " << shape_str(x.shape()));
  return on_weights_device(frame).to(layers_->quant_conv.weight.dtype());
}

LatentDistribution AutoencoderKLQwenImage::encode(const Tensor& images) const {
  const Tensor x = frame_of(images, "encode", config_.input_channels);
  const int64_t f = config_.scale_factor();
  KILN_CHECK(x.size(2) % f == 0 && x.size(3) % f == 0, "AutoencoderKLQwenImage.encode: image size "
                                                           << x.size(2) << "x" << x.size(3)
                                                           << " is not a multiple of " << f);
  const bool tiled =
      tiling_ && (x.size(2) > tiling_->tile_sample_min_height || x.size(3) > tiling_->tile_sample_min_width);
  const Tensor moments = tiled ? tiled_encode(x) : encoder_forward(x);
  const auto halves = chunk(moments, 2, 1);
  // diffusers' DiagonalGaussianDistribution clamps the log-variance to [-30, 20].
  return {halves[0].to(images.dtype()), clamp(halves[1], -30.0, 20.0).to(images.dtype())};
}

Tensor AutoencoderKLQwenImage::decode(const Tensor& vae_latents) const {
  const Tensor z = frame_of(vae_latents, "decode", config_.z_dim);
  const int64_t f = config_.scale_factor();
  if (tiling_ &&
      (z.size(2) > tiling_->tile_sample_min_height / f || z.size(3) > tiling_->tile_sample_min_width / f))
    return tiled_decode(z).to(vae_latents.dtype());
  return clamp(decoder_forward(z), -1.0, 1.0).to(vae_latents.dtype());
}

Tensor AutoencoderKLQwenImage::decoder_forward(const Tensor& z) const {
  return layers_->decoder.forward(layers_->post_quant_conv.forward(z));
}

Tensor AutoencoderKLQwenImage::encoder_forward(const Tensor& x) const {
  return layers_->quant_conv.forward(layers_->encoder.forward(x));
}

Tensor AutoencoderKLQwenImage::tiled_decode(const Tensor& z) const {
  const auto& t = *tiling_;
  const int64_t f = config_.scale_factor();
  const qwen_image_vae::TileGrid grid{
      .tile_h = t.tile_sample_min_height / f,
      .tile_w = t.tile_sample_min_width / f,
      .stride_h = t.tile_sample_stride_height / f,
      .stride_w = t.tile_sample_stride_width / f,
      .blend_h = t.tile_sample_min_height - t.tile_sample_stride_height,
      .blend_w = t.tile_sample_min_width - t.tile_sample_stride_width,
      .keep_h = t.tile_sample_stride_height,
      .keep_w = t.tile_sample_stride_width,
      .out_h = z.size(2) * f,
      .out_w = z.size(3) * f,
  };
  return qwen_image_vae::run_tiled(z, grid, [this](const Tensor& tile) { return decoder_forward(tile); });
}

Tensor AutoencoderKLQwenImage::tiled_encode(const Tensor& x) const {
  const auto& t = *tiling_;
  const int64_t f = config_.scale_factor();
  const qwen_image_vae::TileGrid grid{
      .tile_h = t.tile_sample_min_height,
      .tile_w = t.tile_sample_min_width,
      .stride_h = t.tile_sample_stride_height,
      .stride_w = t.tile_sample_stride_width,
      .blend_h = t.tile_sample_min_height / f - t.tile_sample_stride_height / f,
      .blend_w = t.tile_sample_min_width / f - t.tile_sample_stride_width / f,
      .keep_h = t.tile_sample_stride_height / f,
      .keep_w = t.tile_sample_stride_width / f,
      .out_h = x.size(2) / f,
      .out_w = x.size(3) / f,
  };
  return qwen_image_vae::run_tiled(x, grid, [this](const Tensor& tile) { return encoder_forward(tile); });
}

void AutoencoderKLQwenImage::enable_tiling(const AutoencoderKLQwenImageTiling& t) {
  const int64_t f = config_.scale_factor();
  const auto check = [f](const char* name, int64_t value) {
    KILN_CHECK(value > 0 && value % f == 0,
               "AutoencoderKLQwenImage.enable_tiling: " << name << " " << value
                                                        << " is not a positive multiple of " << f);
  };
  check("tile_sample_min_height", t.tile_sample_min_height);
  check("tile_sample_min_width", t.tile_sample_min_width);
  check("tile_sample_stride_height", t.tile_sample_stride_height);
  check("tile_sample_stride_width", t.tile_sample_stride_width);
  KILN_CHECK(t.tile_sample_stride_height <= t.tile_sample_min_height &&
                 t.tile_sample_stride_width <= t.tile_sample_min_width,
             "AutoencoderKLQwenImage.enable_tiling: strides "
                 << t.tile_sample_stride_height << "x" << t.tile_sample_stride_width << " exceed the tiles "
                 << t.tile_sample_min_height << "x" << t.tile_sample_min_width
                 << " (the tiles would leave gaps)");
  tiling_ = t;
}

namespace {

// The pipelines' per-channel statistics: torch.tensor(list) (float32), for the std its reciprocal in
// float32, then .to(latents.dtype).
Tensor channel_values(const std::vector<double>& values, bool reciprocal, const Tensor& like) {
  std::vector<float> v;
  v.reserve(values.size());
  for (double x : values) v.push_back(reciprocal ? 1.0f / static_cast<float>(x) : static_cast<float>(x));
  return Tensor::from_vector(v, {1, static_cast<int64_t>(v.size()), 1, 1}).to(like.dtype()).to(like.device());
}

void check_latents(const Tensor& x, int64_t z_dim, const char* op) {
  KILN_CHECK(x.defined() && x.dim() == 4 && x.size(1) == z_dim,
             "AutoencoderKLQwenImage." << op << ": expected latents [B, " << z_dim << ", h, w], got "
                                       << (x.defined() ? shape_str(x.shape()) : std::string("undefined")));
}

}  // namespace

Tensor AutoencoderKLQwenImage::to_latents(const Tensor& vae_latents) const {
  check_latents(vae_latents, config_.z_dim, "to_latents");
  return mul(sub(vae_latents, channel_values(config_.latents_mean, false, vae_latents)),
             channel_values(config_.latents_std, true, vae_latents));
}

Tensor AutoencoderKLQwenImage::from_latents(const Tensor& latents) const {
  check_latents(latents, config_.z_dim, "from_latents");
  return add(div(latents, channel_values(config_.latents_std, true, latents)),
             channel_values(config_.latents_mean, false, latents));
}

void AutoencoderKLQwenImage::set_tiling(std::optional<int64_t> tile_size) {
  if (!tile_size) {
    disable_tiling();
    return;
  }
  AutoencoderKLQwenImageTiling t;
  if (*tile_size != 0) {
    const int64_t f = config_.scale_factor();
    const int64_t stride = *tile_size * 3 / 4 / f * f;
    t = {*tile_size, *tile_size, stride, stride};
  }
  enable_tiling(t);
}

std::unique_ptr<AutoencoderKLQwenImage> load_autoencoder_kl_qwen_image(const std::string& folder,
                                                                       DType dtype) {
  auto model = std::make_unique<AutoencoderKLQwenImage>(
      AutoencoderKLQwenImageConfig::from_file(folder + "/config.json"));
  nn::CheckpointWeights weights(folder);
  nn::LoadOptions options;
  options.dtype = dtype;
  model->load_weights(weights, options);
  return model;
}

}  // namespace kiln::models
