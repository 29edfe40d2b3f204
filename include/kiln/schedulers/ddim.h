// DDIMScheduler with eta = 0 (deterministic DDIM, as the Stable Diffusion pipelines call it).
#pragma once

#include "kiln/schedulers/discrete_schedule.h"

namespace kiln {

class DDIMScheduler final : public DiscreteScheduler {
 public:
  explicit DDIMScheduler(
      const DiscreteScheduleConfig& config = DiscreteScheduleConfig::defaults(DiscreteSchedulerKind::DDIM));

  // num_inference_steps must not exceed num_train_timesteps.
  void set_timesteps(int num_inference_steps) override;
  // x0 and the noise direction from the prediction type, then the sample at the previous timestep
  // (t - num_train_timesteps / n, whatever the spacing, as diffusers computes it). No history: steps may be
  // taken in any order. The result has model_output's dtype; the arithmetic is float32.
  Tensor step(const Tensor& model_output, int step_index, const Tensor& sample,
              const NoiseDraw& noise = {}) override;
  // sqrt(alphas_cumprod[t]) * sample + sqrt(1 - alphas_cumprod[t]) * noise at t = timesteps()[step_index], in
  // the sample's dtype.
  Tensor scale_noise(const Tensor& sample, int step_index, const Tensor& noise) const override;
  std::unique_ptr<Scheduler> clone() const override;
};

}  // namespace kiln
