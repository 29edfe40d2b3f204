#include "kiln/families/qwen_image/autoencoder_kl_qwen_image.h"

#include "families/qwen_image/qwen_image_vae_layers.h"
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
  const Tensor moments = layers_->quant_conv.forward(layers_->encoder.forward(x));
  const auto halves = chunk(moments, 2, 1);
  // diffusers' DiagonalGaussianDistribution clamps the log-variance to [-30, 20].
  return {halves[0].to(images.dtype()), clamp(halves[1], -30.0, 20.0).to(images.dtype())};
}

Tensor AutoencoderKLQwenImage::decode(const Tensor& vae_latents) const {
  const Tensor z = frame_of(vae_latents, "decode", config_.z_dim);
  const Tensor image = layers_->decoder.forward(layers_->post_quant_conv.forward(z));
  return clamp(image, -1.0, 1.0).to(vae_latents.dtype());
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
  KILN_CHECK(!tile_size,
             "AutoencoderKLQwenImage: tiled decoding/encoding is not supported for this VAE yet "
             "(asked for tiles of "
                 << *tile_size << " pixels); decode whole images");
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
