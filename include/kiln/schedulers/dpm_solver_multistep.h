// DPMSolverMultistepScheduler with algorithm_type dpmsolver++: DPM++ 2M (solver_order 2, the midpoint or
// Heun second-order update) and its first-order form, with or without Karras sigmas ("DPM++ 2M Karras").
// The multistep update uses the previous step's prediction, kept in this object: a pipeline steps the
// call's own clone() and two calls never share history.
#pragma once

#include <vector>

#include "kiln/schedulers/discrete_schedule.h"

namespace kiln {

class DPMSolverMultistepScheduler final : public DiscreteScheduler {
 public:
  explicit DPMSolverMultistepScheduler(
      const DiscreteScheduleConfig& config =
          DiscreteScheduleConfig::defaults(DiscreteSchedulerKind::DPMSolverMultistep));

  // Sets the schedule and clears the history.
  void set_timesteps(int num_inference_steps) override;
  // One per timestep plus the final one (0, or the smallest training sigma with final_sigmas_type sigma_min).
  const std::vector<float>& sigmas() const { return sigmas_; }
  // The first call may start at any step (image-to-image starts mid-schedule); later calls must take the
  // next step, since the update uses the previous ones. The result has model_output's dtype; the arithmetic
  // is float32.
  Tensor step(const Tensor& model_output, int step_index, const Tensor& sample,
              const NoiseDraw& noise = {}) override;
  // diffusers' add_noise: alpha_t * sample + sigma_t * noise with alpha_t = 1 / sqrt(sigma^2 + 1) and
  // sigma_t = sigma * alpha_t, in the sample's dtype.
  Tensor scale_noise(const Tensor& sample, int step_index, const Tensor& noise) const override;
  std::unique_ptr<Scheduler> clone() const override;

 private:
  std::vector<float> sigmas_;
  Tensor previous_x0_;  // the data prediction of the last step (diffusers' model_outputs[-2] next step)
  int lower_order_nums_ = 0;
  int last_step_ = -1;
};

}  // namespace kiln
