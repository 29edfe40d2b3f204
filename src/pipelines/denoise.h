// The denoising loop of every pipeline (diffusers' `for i, t in enumerate(timesteps)`), general enough for
// what text-to-image, image-to-image and inpainting need: any Scheduler, initial latents and a first step
// (image-to-image starts part-way), a hook that blends the kept region back after each step (inpainting), and
// the caller's callback, which may change the latents or stop the loop. Cancellation is checked before every
// step.
#pragma once

#include <functional>

#include "kiln/pipelines/pipeline_request.h"
#include "kiln/schedulers/scheduler.h"

namespace kiln::pipelines {

struct DenoiseLoop {
  // The call's own scheduler (it may keep state across steps: a multistep sampler's history).
  Scheduler* scheduler = nullptr;
  int start_step = 0;  // the first step run (0: the whole schedule)
  // The step the loop stops before (SDXL's denoising_end); -1: the schedule's end.
  int end_step = -1;
  // The model's prediction for `latents` at step `step` (the scheduler's timestep `timestep`); the latents
  // are the scheduler's scale_model_input of the loop's.
  std::function<Tensor(const Tensor& latents, int step, float timestep)> model_output;
  // The call's noise, for a scheduler that adds fresh noise at each step (an ancestral sampler).
  NoiseDraw noise;
  // After each update: the latents to continue from (inpainting blends the noised original back outside the
  // mask). Unset: the update as it is.
  std::function<Tensor(const Tensor& latents, int step)> blend;
  // After each step (diffusers' callback_on_step_end): may replace the latents or stop the loop.
  std::function<void(StepState&)> on_step_end;
  // Checked before every step; throws Cancelled (naming how far the loop got) once cancelled.
  std::function<void(const std::string& where)> checkpoint;
};

// Runs steps start_step .. n - 1 (end_step - 1 when set) from `latents`, waiting for each step to finish so
// that the callback gets its time; returns the final latents. With no blend, callback or stop, the result is
// the plain Euler loop's bit for bit.
Tensor denoise(Tensor latents, const DenoiseLoop& loop);

// Inpainting's blend (diffusers' FLUX.1 and SD3 inpaint pipelines): where `mask` is 0, the image's latents
// noised to the next step's level (clean after the last step run: `end_step`'s, the schedule's when -1, as
// diffusers' loops blend the clean latents after the last timestep they keep); where 1, the denoised
// latents. `scheduler` must outlive the loop.
std::function<Tensor(const Tensor&, int)> inpaint_blend(const Scheduler& scheduler, Tensor image_latents,
                                                        Tensor noise, Tensor mask, int end_step = -1);

}  // namespace kiln::pipelines
