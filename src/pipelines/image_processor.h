// diffusers' VaeImageProcessor for the image-editing pipelines (image-to-image, inpainting, Fill), for PIL
// images, bit for bit: the image resized to the call's size with PIL's Lanczos (unless it has that size
// already), [0, 255] -> [0, 1] in float32 (numpy's `/ 255.0`) -> [-1, 1]; the mask resized in its own mode,
// converted to gray (PIL's "L"), -> [0, 1], binarised at 0.5. And the pieces around them: the VAE's posterior
// sample, torch's nearest-neighbour resize of a mask to the latents' size, and the first step a strength
// runs.
#pragma once

#include <cstdint>

#include "kiln/core/tensor.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/pipelines/generator.h"
#include "kiln/pipelines/image.h"

namespace kiln::pipelines {

// -> [1, 3, height, width] float32 in [-1, 1] (RGB: gray repeated, alpha dropped, as PIL's convert("RGB")).
Tensor preprocess_image(const Image& image, int64_t height, int64_t width);
// -> [1, 1, height, width] float32 of 0 and 1 (mask_processor: do_normalize=False, do_binarize=True,
// do_convert_grayscale=True).
Tensor preprocess_mask(const Image& mask, int64_t height, int64_t width);
// torch.nn.functional.interpolate(x, size=(height, width)) (mode "nearest") of x [N, C, H, W].
Tensor resize_nearest(const Tensor& x, int64_t height, int64_t width);
// DiagonalGaussianDistribution.sample(generator): mean + exp(0.5 logvar) * randn, in the mean's dtype.
Tensor sample_latents(const models::AutoencoderKL::LatentDistribution& posterior, Generator& generator);
// The pipelines' get_timesteps: the first of `num_inference_steps` steps that `strength` (in [0, 1]) runs,
// int(max(n - min(n * strength, n), 0)) in Python floats; with `whole_steps` (diffusers' SD and SDXL
// pipelines) n - min(int(n * strength), n): the steps run are floored first (SDXL inpainting's default 0.9999
// of 30 steps runs 29, not 30).
int first_step(int num_inference_steps, double strength, bool whole_steps = false);

}  // namespace kiln::pipelines
