// What a pipeline needs of its VAE, whatever the VAE: images to the latents its denoiser works in and back.
// A 2-D VAE (AutoencoderKL) or a 3-D one over a single frame, latents normalised by a scale and a shift
// (FLUX.1, SD3), by per-channel statistics, or patchified and batch-normalised (FLUX.2): the pipelines'
// shared stages (image-to-image, inpainting, reference images) and the denoising loop see only this.
#pragma once

#include <cstdint>
#include <optional>

#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"

namespace kiln::models {

// The VAE's posterior over its latents: a diagonal Gaussian (diffusers' DiagonalGaussianDistribution).
struct LatentDistribution {
  Tensor mean, logvar;
};

class LatentCodec {
 public:
  virtual ~LatentCodec() = default;

  // Image pixels per latent pixel (of latent_shape).
  virtual int64_t pixels_per_latent() const = 0;
  // The shape [B, C, h, w] of the latents (as the denoiser works in them) of `batch` images of height x
  // width: the noise a call draws.
  virtual Shape latent_shape(int64_t batch, int64_t height, int64_t width) const = 0;
  // Images [B, 3, H, W] in [-1, 1] -> the posterior over the VAE's own latents.
  virtual LatentDistribution encode(const Tensor& images) const = 0;
  // The VAE's latents -> the latents the denoiser works in, and back.
  virtual Tensor to_latents(const Tensor& vae_latents) const = 0;
  virtual Tensor from_latents(const Tensor& latents) const = 0;
  // The VAE's latents -> images [B, 3, H, W] in [-1, 1] (not clamped), in the latents' dtype.
  virtual Tensor decode(const Tensor& vae_latents) const = 0;
  // Decoding (and encoding) in overlapping tiles of `tile_size` pixels (0: the VAE's own default); nullopt:
  // whole images.
  virtual void set_tiling(std::optional<int64_t> tile_size) = 0;
};

}  // namespace kiln::models
