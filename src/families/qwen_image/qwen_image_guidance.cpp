#include "families/qwen_image/qwen_image_guidance.h"

#include <algorithm>
#include <string>

#include "kiln/core/log.h"
#include "kiln/families/qwen_image/autoencoder_kl_qwen_image.h"
#include "kiln/ops.h"
#include "pipelines/pipeline_common.h"

namespace kiln::qwen_image {

bool true_cfg_enabled(const PipelineRequest& request) {
  return request.true_cfg_scale.value_or(4.0f) > 1.0f && pipelines::has_negative_prompt(request);
}

TrueCfg true_cfg_of(const char* pipeline, const PipelineRequest& request) {
  TrueCfg cfg;
  cfg.scale = request.true_cfg_scale.value_or(4.0f);
  const bool negative = pipelines::has_negative_prompt(request);
  cfg.enabled = true_cfg_enabled(request);
  if (negative && cfg.scale <= 1.0f)
    warn(std::string(pipeline) + ": negative_prompt is ignored unless true_cfg_scale > 1, as in diffusers");
  else if (!negative && request.true_cfg_scale && cfg.scale > 1.0f)
    warn(std::string(pipeline) +
         ": true_cfg_scale has no effect without negative_prompt (even \" \" enables it), as in diffusers");
  return cfg;
}

Tensor norm_rescaled_cfg(const Tensor& cond, const Tensor& uncond, float scale) {
  const Tensor combined = add(uncond, mul(static_cast<double>(scale), sub(cond, uncond)));
  // torch.norm over the last axis: accumulated in float32, returned in the input's dtype.
  const auto norm = [](const Tensor& x) {
    return sqrt(sum(square(x.to(float32)), {-1}, /*keepdim=*/true)).to(x.dtype());
  };
  return mul(combined, div(norm(cond), norm(combined)));
}

int64_t vae_activation_bytes(const models::AutoencoderKLQwenImageConfig& config, int64_t batch,
                             int64_t height, int64_t width, DType dtype) {
  const int64_t base = config.base_dim;
  const int64_t first = config.dim_mult.empty() ? 1 : config.dim_mult.front();
  const int64_t second = config.dim_mult.size() > 1 ? config.dim_mult[1] : first;
  const int64_t f = std::max<int64_t>(config.scale_factor(), 1);
  const int64_t pixels = batch * height * width;
  // A residual block holds its input, a normalised copy and its output; the mid-block attention its scores.
  const int64_t full = 3 * pixels * base * first;
  const int64_t half = 3 * (pixels / 4) * base * second * 2;
  const int64_t latent_pixels = (height / f) * (width / f);
  const int64_t attention = batch * latent_pixels * latent_pixels;
  return std::max({full, half, attention}) * static_cast<int64_t>(dtype_size(dtype));
}

}  // namespace kiln::qwen_image
