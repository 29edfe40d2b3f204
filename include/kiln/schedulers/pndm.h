// PNDMScheduler with skip_prk_steps (Stable Diffusion 1.5's default scheduler): the PLMS (pseudo linear
// multistep) updates only. Its schedule repeats the second timestep: n steps asked give n + 1 model
// evaluations, the second of which re-runs the first update with the average of the two outputs. The
// previous outputs are kept in this object: a pipeline steps the call's own clone().
#pragma once

#include <vector>

#include "kiln/schedulers/discrete_schedule.h"

namespace kiln {

class PNDMScheduler final : public DiscreteScheduler {
 public:
  // The config cannot ask for the Runge-Kutta warm-up steps: DiscreteScheduleConfig::from_json refuses
  // skip_prk_steps = false.
  explicit PNDMScheduler(
      const DiscreteScheduleConfig& config = DiscreteScheduleConfig::defaults(DiscreteSchedulerKind::PNDM));

  // Sets n + 1 timesteps and clears the history.
  void set_timesteps(int num_inference_steps) override;
  // The first call may start at any step (image-to-image); later calls must take the next step. The result
  // has model_output's dtype; the arithmetic is float32.
  Tensor step(const Tensor& model_output, int step_index, const Tensor& sample,
              const NoiseDraw& noise = {}) override;
  // As DDIMScheduler::scale_noise.
  Tensor scale_noise(const Tensor& sample, int step_index, const Tensor& noise) const override;
  std::unique_ptr<Scheduler> clone() const override;

 private:
  std::vector<Tensor> ets_;  // the model outputs of the last steps, at most 4
  Tensor cur_sample_;        // the sample of the first step, which the repeated second step starts from
  int counter_ = 0;
  int last_step_ = -1;
};

}  // namespace kiln
