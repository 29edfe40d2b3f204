// What the denoising loop (pipelines/denoise.h) needs of a scheduler, whatever its kind: the timesteps of the
// schedule it was set to, one update per step, and the forward process that image-to-image starts from and
// inpainting blends with. FlowMatchEulerDiscreteScheduler is the one Kiln has; a new sampler implements this.
//
// Setting a schedule (set_timesteps) takes arguments that differ per kind of scheduler, so it is not part of
// the interface: a pipeline keeps one configured scheduler and gives every call its own copy to set, so that
// calls never share schedule state.
#pragma once

#include <vector>

#include "kiln/core/tensor.h"

namespace kiln {

class Scheduler {
 public:
  virtual ~Scheduler() = default;

  // One per step of the schedule set, as the transformer is given them (before its own scaling).
  virtual const std::vector<float>& timesteps() const = 0;
  int num_inference_steps() const { return static_cast<int>(timesteps().size()); }
  // The sample after step `step_index` (0 .. num_inference_steps - 1), from the model's output.
  virtual Tensor step(const Tensor& model_output, int step_index, const Tensor& sample) const = 0;
  // The forward process: `sample` (clean latents) noised with `noise` to the level of step `step_index`.
  virtual Tensor scale_noise(const Tensor& sample, int step_index, const Tensor& noise) const = 0;
};

}  // namespace kiln
