#include "pipelines/denoise.h"

#include <chrono>
#include <string>

#include "kiln/core/allocator.h"
#include "kiln/ops.h"
#include "kiln/runtime/execution_context.h"

namespace kiln::pipelines {

Tensor denoise(Tensor latents, const DenoiseLoop& loop) {
  const std::vector<float>& timesteps = loop.scheduler->timesteps();
  const int n = static_cast<int>(timesteps.size());
  KILN_CHECK(loop.start_step >= 0 && loop.start_step <= n,
             "denoise: the first step " << loop.start_step << " is outside the schedule's " << n << " steps");
  KILN_CHECK(loop.end_step == -1 || (loop.end_step >= loop.start_step && loop.end_step <= n),
             "denoise: the end step " << loop.end_step << " is not between the first step " << loop.start_step
                                      << " and the schedule's " << n << " steps");
  const int end = loop.end_step == -1 ? n : loop.end_step;
  // Every step asks for the same sizes: the CPU allocator keeps what a step frees for the next.
  const RepeatedShapesScope repeated(cpu);
  for (int i = loop.start_step; i < end; ++i) {
    if (loop.checkpoint)
      loop.checkpoint(i == loop.start_step
                          ? "before the first denoising step"
                          : "after denoising step " + std::to_string(i) + " of " + std::to_string(n));
    const auto start = std::chrono::steady_clock::now();
    const Tensor v = loop.model_output(loop.scheduler->scale_model_input(latents, i), i,
                                       timesteps[static_cast<size_t>(i)]);
    // The noise is drawn on the host; the latents then stay where the transformer runs.
    if (latents.device() != v.device()) latents = latents.to(v.device());
    latents = loop.scheduler->step(v, i, latents, loop.noise);
    if (loop.blend) latents = loop.blend(latents, i);
    synchronize(latents.device());
    StepState state{
        .step = i,
        .num_steps = end,
        .timestep = timesteps[static_cast<size_t>(i)],
        .seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
        .latents = latents};
    if (loop.on_step_end) {
      loop.on_step_end(state);
      if (!state.latents.defined() || state.latents.shape() != latents.shape() ||
          state.latents.dtype() != latents.dtype())
        throw RequestError("callback_on_step_end",
                           "callback_on_step_end: the latents it returns must keep their shape and dtype " +
                               latents.str() + ", got " +
                               (state.latents.defined() ? state.latents.str() : std::string("none")));
      latents = state.latents;
      if (state.stop) break;
    }
  }
  return latents;
}

std::function<Tensor(const Tensor&, int)> inpaint_blend(const Scheduler& scheduler, Tensor image_latents,
                                                        Tensor noise, Tensor mask, int end_step) {
  return [&scheduler, image_latents, noise, mask, end_step](const Tensor& x, int step) {
    const int next = step + 1;
    const Device on = x.device();
    const int end = end_step == -1 ? scheduler.num_inference_steps() : end_step;
    const Tensor kept =
        next < end ? scheduler.scale_noise(image_latents.to(on), next, noise.to(on)) : image_latents.to(on);
    return add(mul(sub(1.0, mask.to(on)), kept), mul(mask.to(on), x));
  };
}

}  // namespace kiln::pipelines
