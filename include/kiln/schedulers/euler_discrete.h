// EulerDiscreteScheduler: diffusers' Euler sampler over a variance-exploding sigma schedule, SDXL's default
// ("leading" spacing, steps_offset 1) and a common choice for SD 1.5. Deterministic (s_churn 0, as the
// pipelines call it). The sigmas are interpolated linearly at the spaced timesteps, or Karras et al.'s with
// use_karras_sigmas (then the timesteps are fractional, as diffusers passes them).
#pragma once

#include <vector>

#include "kiln/schedulers/discrete_schedule.h"

namespace kiln {

class EulerDiscreteScheduler final : public DiscreteScheduler {
 public:
  explicit EulerDiscreteScheduler(
      const DiscreteScheduleConfig& config = DiscreteScheduleConfig::defaults(DiscreteSchedulerKind::Euler));

  void set_timesteps(int num_inference_steps) override;
  // One per timestep plus the final one (0, or the smallest training sigma with final_sigmas_type sigma_min).
  const std::vector<float>& sigmas() const { return sigmas_; }
  // The largest sigma, or sqrt(sigma^2 + 1) of it with "leading" spacing (diffusers' rule).
  double init_noise_sigma() const override;
  // sample / sqrt(sigma^2 + 1), in the sample's dtype.
  Tensor scale_model_input(const Tensor& sample, int step_index) const override;
  // sample + (sample - x0) / sigma * (sigma_next - sigma) in float32, x0 from the prediction type; the result
  // has model_output's dtype. Steps may be taken in any order (the update has no history).
  Tensor step(const Tensor& model_output, int step_index, const Tensor& sample,
              const NoiseDraw& noise = {}) override;
  // diffusers' add_noise at step `step_index`: sample + noise * sigma, in the sample's dtype.
  Tensor scale_noise(const Tensor& sample, int step_index, const Tensor& noise) const override;
  std::unique_ptr<Scheduler> clone() const override;

 private:
  std::vector<float> sigmas_;
};

}  // namespace kiln
