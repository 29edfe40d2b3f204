// diffusers' AutoencoderKLFlux2 (the FLUX.2 VAE): AutoencoderKL's encoder and decoder (with quant_conv and
// post_quant_conv, and optionally its own decoder widths) plus the BatchNorm2d running statistics of the
// 2x2-patchified latents, which the FLUX.2 pipelines use to normalise what the transformer sees. The
// pipelines' latents are these patchified and normalised (its LatentCodec side); the helpers are diffusers'
// (Flux2Pipeline._patchify_latents, _unpatchify_latents, _encode_vae_image and the decode path), with the
// same dtype path.
#pragma once

#include <memory>
#include <string>

#include "kiln/models/autoencoder_kl.h"

namespace kiln::models {

class AutoencoderKLFlux2 : public AutoencoderKL {
 public:
  // `config.flux2` must be set (a config.json with "_class_name": "AutoencoderKLFlux2").
  explicit AutoencoderKLFlux2(const AutoencoderKLConfig& config);

  // Channels of the patchified latents: 4 * latent_channels.
  int64_t patchified_channels() const { return 4 * config().latent_channels; }
  // [B, C, 2h, 2w] -> [B, 4C, h, w], channel c * 4 + dy * 2 + dx holding pixel (2r + dy, 2c + dx).
  static Tensor patchify(const Tensor& latents);
  // The inverse: [B, 4C, h, w] -> [B, C, 2h, 2w].
  static Tensor unpatchify(const Tensor& patchified);
  // (z - running_mean) / sqrt(running_var + batch_norm_eps) per patchified channel, in z's dtype (the
  // statistics are computed in the weights' dtype, then cast, as diffusers does): what encoded reference
  // images become.
  Tensor normalize(const Tensor& patchified) const;
  // z * sqrt(running_var + batch_norm_eps) + running_mean: the denoised latents before unpatchify and decode.
  Tensor denormalize(const Tensor& patchified) const;

  // ---- LatentCodec: the pipelines' latents are the VAE's patchified and normalised,
  // [B, 4 * latent_channels, H / 16, W / 16].
  int64_t pixels_per_latent() const override { return 2 * config().scale_factor(); }
  Shape latent_shape(int64_t batch, int64_t height, int64_t width) const override;
  Tensor to_latents(const Tensor& vae_latents) const override;  // normalize(patchify(z))
  Tensor from_latents(const Tensor& latents) const override;    // unpatchify(denormalize(z))

  // bn.running_mean / bn.running_var [4 * latent_channels]; bn.num_batches_tracked (a training counter,
  // unused) may be present in the file.
  Tensor running_mean, running_var, num_batches_tracked;

 private:
  // [1, 4C, 1, 1] mean and std in `dtype`.
  std::pair<Tensor, Tensor> statistics(DType dtype) const;
};

// Reads `folder`/config.json ("_class_name": "AutoencoderKLFlux2") and the weights, converted to `dtype`.
std::unique_ptr<AutoencoderKLFlux2> load_autoencoder_kl_flux2(const std::string& folder, DType dtype);

}  // namespace kiln::models
