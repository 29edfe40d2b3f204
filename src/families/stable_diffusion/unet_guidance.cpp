#include "families/stable_diffusion/unet_guidance.h"

#include "kiln/ops.h"

namespace kiln::models {

Tensor unet_noise_prediction(const UNetStep& step, const Tensor& latents, float t) {
  // diffusers' cat([scale_model_input(latents), mask, masked_image_latents], dim=1), each doubled under
  // guidance: the same as doubling the concatenation.
  const Tensor in =
      step.inpainting_channels.defined()
          ? concat({latents, step.inpainting_channels.to(latents.dtype()).to(latents.device())}, 1)
          : latents;
  const Tensor x = step.guided ? concat({in, in}, 0) : in;
  const Tensor timestep = Tensor::full({x.size(0)}, static_cast<double>(t), float32);
  const Tensor out = step.unet.forward(x, timestep, step.context, step.added).to(latents.dtype());
  if (!step.guided) return out;
  const int64_t batch = latents.size(0);
  const Tensor uncond = out.narrow(0, 0, batch), text = out.narrow(0, batch, batch);
  const Tensor guided = add(uncond, mul(sub(text, uncond), static_cast<double>(step.guidance_scale)));
  return step.guidance_rescale > 0.0f ? rescale_noise_cfg(guided, text, step.guidance_rescale) : guided;
}

Tensor rescale_noise_cfg(const Tensor& cfg, const Tensor& text, float rescale) {
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < cfg.dim(); ++d) dims.push_back(d);
  const Tensor std_text = sqrt(var(text, dims, 1, true));
  const Tensor std_cfg = sqrt(var(cfg, dims, 1, true));
  const Tensor rescaled = mul(cfg, div(std_text, std_cfg));
  const double r = static_cast<double>(rescale);
  return add(mul(rescaled, r), mul(cfg, 1.0 - r));
}

}  // namespace kiln::models
