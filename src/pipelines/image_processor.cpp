#include "pipelines/image_processor.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/ops.h"
#include "kiln/schedulers/discrete_schedule.h"
#include "pipelines/pil_convert.h"
#include "pipelines/pil_resize.h"

namespace kiln::pipelines {

namespace {

// PIL's resize returns a copy when the size does not change; Lanczos would still filter.
Image resized(const Image& image, int64_t height, int64_t width) {
  if (image.width == width && image.height == height) return image;
  return resize_lanczos(image, static_cast<int>(width), static_cast<int>(height));
}

// pil_to_numpy: float32 values / 255 (numpy divides in float32), as [H, W, C].
Tensor unit_values(const Image& image) {
  const Tensor hwc = Tensor::from_vector(image.pixels, {image.height, image.width, image.channels});
  return div(hwc.to(float32), 255.0);
}

}  // namespace

Tensor preprocess_image(const Image& image, int64_t height, int64_t width) {
  check_image(image, "image");
  const Tensor unit = unit_values(to_rgb(resized(image, height, width)));
  // normalize: 2 x - 1
  return sub(mul(unit, 2.0), 1.0).permute({2, 0, 1}).unsqueeze(0).contiguous();
}

Tensor preprocess_mask(const Image& mask, int64_t height, int64_t width) {
  check_image(mask, "mask_image");
  // Resized in its own mode first, then converted to gray, as VaeImageProcessor.preprocess orders them.
  const Image gray = to_luma(resized(mask, height, width));
  // pil_to_numpy (float32 / 255), then binarize: < 0.5 -> 0, else 1. A value v / 255 is below 0.5 in float32
  // exactly when v <= 127.
  std::vector<float> values(gray.pixels.size());
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(gray.pixels[i]) / 255.0f < 0.5f ? 0 : 1;
  return Tensor::from_vector(values, {1, 1, height, width});
}

Tensor resize_nearest(const Tensor& x, int64_t height, int64_t width) {
  KILN_CHECK(x.dim() == 4, "resize_nearest: expected [N, C, H, W], got " << x.str());
  KILN_CHECK(x.dtype() == float32, "resize_nearest: expected float32 values, got " << x.str());
  // torch's nearest index: floor(out_index * (float) in / out), clamped to the input.
  const auto indices = [](int64_t in, int64_t out) {
    const float scale = static_cast<float>(in) / static_cast<float>(out);
    std::vector<int64_t> index(static_cast<size_t>(out));
    for (int64_t i = 0; i < out; ++i)
      index[static_cast<size_t>(i)] =
          std::min(static_cast<int64_t>(std::floor(static_cast<float>(i) * scale)), in - 1);
    return index;
  };
  const std::vector<int64_t> rows = indices(x.size(2), height), cols = indices(x.size(3), width);
  const int64_t planes = x.size(0) * x.size(1), in_h = x.size(2), in_w = x.size(3);
  const std::vector<float> in = x.contiguous().to_vector<float>();
  std::vector<float> out(static_cast<size_t>(planes * height * width));
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t r = 0; r < height; ++r)
      for (int64_t c = 0; c < width; ++c)
        out[static_cast<size_t>((p * height + r) * width + c)] = in[static_cast<size_t>(
            (p * in_h + rows[static_cast<size_t>(r)]) * in_w + cols[static_cast<size_t>(c)])];
  return Tensor::from_vector(out, {x.size(0), x.size(1), height, width});
}

Tensor sample_latents(const models::AutoencoderKL::LatentDistribution& posterior, Generator& generator) {
  // Drawn on the host by torch's CPU generator, whatever device the VAE ran on.
  const Tensor noise =
      randn_tensor(posterior.mean.shape(), generator, posterior.mean.dtype()).to(posterior.mean.device());
  const Tensor std = exp(mul(posterior.logvar, 0.5));
  return add(posterior.mean, mul(std, noise));
}

int first_step(int num_inference_steps, double strength, bool whole_steps) {
  if (whole_steps) return img2img_start_index(num_inference_steps, strength);
  const double n = num_inference_steps;
  const double init_timestep = std::min(n * strength, n);
  return static_cast<int>(std::max(n - init_timestep, 0.0));
}

}  // namespace kiln::pipelines
