// EulerAncestralDiscreteScheduler ("Euler a"): the Euler step to a lower sigma followed by fresh noise up to
// the next sigma, drawn at every step from the call's generators through the NoiseDraw given to step() (as
// diffusers' step(..., generator=) draws randn_tensor(model_output.shape, dtype=model_output.dtype)).
#pragma once

#include <vector>

#include "kiln/schedulers/discrete_schedule.h"

namespace kiln {

class EulerAncestralDiscreteScheduler final : public DiscreteScheduler {
 public:
  explicit EulerAncestralDiscreteScheduler(
      const DiscreteScheduleConfig& config =
          DiscreteScheduleConfig::defaults(DiscreteSchedulerKind::EulerAncestral));

  void set_timesteps(int num_inference_steps) override;
  // One per timestep plus a final 0.
  const std::vector<float>& sigmas() const { return sigmas_; }
  double init_noise_sigma() const override;
  Tensor scale_model_input(const Tensor& sample, int step_index) const override;
  // Throws when `noise` is unset: the sampler cannot step without fresh noise. The result has model_output's
  // dtype; the arithmetic is float32.
  Tensor step(const Tensor& model_output, int step_index, const Tensor& sample,
              const NoiseDraw& noise = {}) override;
  Tensor scale_noise(const Tensor& sample, int step_index, const Tensor& noise) const override;
  std::unique_ptr<Scheduler> clone() const override;

 private:
  std::vector<float> sigmas_;
};

}  // namespace kiln
