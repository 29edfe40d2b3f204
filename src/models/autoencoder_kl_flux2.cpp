#include "kiln/models/autoencoder_kl_flux2.h"

#include "kiln/nn/checkpoint_weights.h"
#include "kiln/ops.h"

namespace kiln::models {

AutoencoderKLFlux2::AutoencoderKLFlux2(const AutoencoderKLConfig& config) : AutoencoderKL(config) {
  KILN_CHECK(config.flux2, "AutoencoderKLFlux2: the config is not an AutoencoderKLFlux2 config");
  const int64_t channels = patchified_channels();
  register_parameter("bn.running_mean", &running_mean, {channels});
  register_parameter("bn.running_var", &running_var, {channels});
  register_parameter("bn.num_batches_tracked", &num_batches_tracked, {}, /*optional=*/true);
}

Tensor AutoencoderKLFlux2::patchify(const Tensor& latents) {
  KILN_CHECK(latents.dim() == 4 && latents.size(2) % 2 == 0 && latents.size(3) % 2 == 0,
             "AutoencoderKLFlux2.patchify: expected latents [B, C, H, W] with even H and W, got "
                 << shape_str(latents.shape()));
  const int64_t b = latents.size(0), c = latents.size(1), h = latents.size(2) / 2, w = latents.size(3) / 2;
  // view [B, C, h, 2, w, 2] -> permute (0, 1, 3, 5, 2, 4) -> [B, 4C, h, w]
  return latents.view({b, c, h, 2, w, 2}).permute({0, 1, 3, 5, 2, 4}).reshape({b, c * 4, h, w});
}

Tensor AutoencoderKLFlux2::unpatchify(const Tensor& patchified) {
  KILN_CHECK(patchified.dim() == 4 && patchified.size(1) % 4 == 0,
             "AutoencoderKLFlux2.unpatchify: expected [B, 4C, h, w], got " << shape_str(patchified.shape()));
  const int64_t b = patchified.size(0), c = patchified.size(1) / 4, h = patchified.size(2),
                w = patchified.size(3);
  // reshape [B, C, 2, 2, h, w] -> permute (0, 1, 4, 2, 5, 3) -> [B, C, 2h, 2w]
  return patchified.reshape({b, c, 2, 2, h, w}).permute({0, 1, 4, 2, 5, 3}).reshape({b, c, h * 2, w * 2});
}

std::pair<Tensor, Tensor> AutoencoderKLFlux2::statistics(DType dtype) const {
  KILN_CHECK(running_mean.defined(),
             "AutoencoderKLFlux2: the weights are not loaded (call load_weights first)");
  const int64_t channels = patchified_channels();
  // diffusers: sqrt(running_var + eps) in the buffers' dtype, then .to(latents.dtype).
  const Tensor std = sqrt(add(running_var, config().batch_norm_eps));
  return {running_mean.view({1, channels, 1, 1}).to(dtype), std.view({1, channels, 1, 1}).to(dtype)};
}

Shape AutoencoderKLFlux2::latent_shape(int64_t batch, int64_t height, int64_t width) const {
  const int64_t f = pixels_per_latent();
  return {batch, patchified_channels(), height / f, width / f};
}

Tensor AutoencoderKLFlux2::to_latents(const Tensor& vae_latents) const {
  return normalize(patchify(vae_latents));
}

Tensor AutoencoderKLFlux2::from_latents(const Tensor& latents) const {
  return unpatchify(denormalize(latents));
}

Tensor AutoencoderKLFlux2::normalize(const Tensor& patchified) const {
  KILN_CHECK(patchified.dim() == 4 && patchified.size(1) == patchified_channels(),
             "AutoencoderKLFlux2.normalize: expected [B, " << patchified_channels() << ", h, w], got "
                                                           << shape_str(patchified.shape()));
  const auto [mean, std] = statistics(patchified.dtype());
  return div(sub(patchified, mean), std);
}

Tensor AutoencoderKLFlux2::denormalize(const Tensor& patchified) const {
  KILN_CHECK(patchified.dim() == 4 && patchified.size(1) == patchified_channels(),
             "AutoencoderKLFlux2.denormalize: expected [B, " << patchified_channels() << ", h, w], got "
                                                             << shape_str(patchified.shape()));
  const auto [mean, std] = statistics(patchified.dtype());
  return add(mul(patchified, std), mean);
}

std::unique_ptr<AutoencoderKLFlux2> load_autoencoder_kl_flux2(const std::string& folder, DType dtype) {
  const std::string config_path = folder + "/config.json";
  const AutoencoderKLConfig config = AutoencoderKLConfig::from_file(config_path);
  KILN_CHECK(config.flux2, config_path << ": _class_name is not AutoencoderKLFlux2 (a FLUX.2 VAE)");
  auto model = std::make_unique<AutoencoderKLFlux2>(config);
  nn::CheckpointWeights weights(folder);
  nn::LoadOptions options;
  options.dtype = dtype;
  model->load_weights(weights, options);
  return model;
}

}  // namespace kiln::models
