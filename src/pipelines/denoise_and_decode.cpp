// DiffusionPipeline::denoise_and_decode: the tail of every family's run
// (kiln/pipelines/diffusion_pipeline.h).
#include "kiln/pipelines/diffusion_pipeline.h"
#include "pipelines/call_control.h"
#include "pipelines/denoise.h"
#include "pipelines/task_stages.h"

namespace kiln {

namespace {

nn::Module* component_named(const DiffusionPipeline& pipe, const std::string& name) {
  for (const auto& [component, module] : pipe.components())
    if (component == name) return module;
  return nullptr;
}

}  // namespace

PipelineOutput DiffusionPipeline::denoise_and_decode(
    const pipelines::TaskCall& task, const pipelines::TaskStart& start,
    const std::function<Tensor(const Tensor&, int, float)>& model_output,
    const std::function<Tensor(const Tensor&)>& decode, bool negative,
    std::map<std::string, std::string> extra, const pipelines::CallControl& control) {
  // The call's own schedule: the loop keeps a stateful sampler's history in it, never in the pipeline's.
  std::unique_ptr<Scheduler> schedule = task.schedule.clone();
  const Tensor latents = pipelines::denoise(
      start.latents, {.scheduler = schedule.get(),
                      .start_step = start.start_step,
                      .model_output = model_output,
                      .noise = pipelines::noise_draw(task.generators),
                      .blend = start.blend,
                      .on_step_end = task.request.callback_on_step_end,
                      .checkpoint = [&](const std::string& where) { control.checkpoint(where); }});
  release_after_use({{"transformer", component_named(*this, "transformer")}});
  if (task.request.output_type == OutputType::Latent) return pipelines::latent_output(task, latents);

  control.checkpoint("before decoding");
  const Tensor images = decode(latents);
  release_after_use({{"vae", component_named(*this, "vae")}});
  std::map<std::string, std::string> metadata = pipelines::call_metadata(task, name_, dtype_, negative);
  for (auto& [key, value] : extra) metadata[key] = std::move(value);
  return pipelines::task_output(task, start, images, std::move(metadata), negative);
}

}  // namespace kiln
