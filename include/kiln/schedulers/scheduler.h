// What the denoising loop (pipelines/denoise.h) needs of a scheduler, whatever its kind: the timesteps of the
// schedule it was set to, the input the denoiser gets at a step (diffusers' scale_model_input: the sample
// itself for flow matching, sample / sqrt(sigma^2 + 1) for Euler over a variance-exploding schedule), how
// much the starting noise is scaled (init_noise_sigma), one update per step, and the forward process that
// image-to-image starts from and inpainting blends with. FlowMatchEulerDiscreteScheduler is the one Kiln has
// today; a new sampler implements this.
//
// A scheduler holds a call's state: a pipeline keeps one configured scheduler and gives every call its own
// copy (clone) to set (set_timesteps, whose arguments differ per kind and are not part of the interface) and
// step through, so a multistep sampler keeps its history in the call's copy and calls never share it.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"

namespace kiln {

// Draws standard normal noise of a shape and dtype from the call's generators (in their order), for samplers
// that add fresh noise at each step (ancestral samplers, as diffusers' step(..., generator=)).
using NoiseDraw = std::function<Tensor(const Shape& shape, DType dtype)>;

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  // A copy with the same configuration and state: a call's own scheduler.
  virtual std::unique_ptr<Scheduler> clone() const = 0;

  // One per step of the schedule set, as the denoiser is given them (before its own scaling).
  virtual const std::vector<float>& timesteps() const = 0;
  int num_inference_steps() const { return static_cast<int>(timesteps().size()); }
  // diffusers' init_noise_sigma: the starting noise of a text-to-image call is scaled by it.
  virtual double init_noise_sigma() const { return 1.0; }
  // diffusers' scale_model_input: what the denoiser is given for `sample` at step `step_index`.
  virtual Tensor scale_model_input(const Tensor& sample, int step_index) const { return sample; }
  // The sample after step `step_index` (0 .. num_inference_steps - 1), from the model's output; a stateful
  // sampler updates its history. `noise` draws the fresh noise an ancestral sampler adds (unset: the call
  // has none to give, which such a sampler refuses).
  virtual Tensor step(const Tensor& model_output, int step_index, const Tensor& sample,
                      const NoiseDraw& noise = {}) = 0;
  // The forward process: `sample` (clean latents) noised with `noise` to the level of step `step_index`.
  virtual Tensor scale_noise(const Tensor& sample, int step_index, const Tensor& noise) const = 0;
};

}  // namespace kiln
