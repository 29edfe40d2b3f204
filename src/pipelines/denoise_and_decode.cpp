// DiffusionPipeline::denoise_and_decode: the tail of every family's run
// (kiln/pipelines/diffusion_pipeline.h).
#include "kiln/pipelines/diffusion_pipeline.h"

#include <sstream>

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

// What the call's step cache did, in the image's text chunks: "cache" (its spec) and "cache_reused" (the
// steps, from 1, whose blocks after the first were reused; "uncond: ..." after them for true CFG's negative
// evaluations), which kiln generate prints.
void step_cache_metadata(const nn::StepCache& cache, int start_step,
                         std::map<std::string, std::string>& metadata) {
  metadata["cache"] = step_cache_spec(*cache.active());
  std::map<std::string, std::string> reused;  // by context
  std::map<std::string, int> evaluations;
  for (const nn::StepCache::Decision& d : cache.decisions()) {
    const int step = start_step + ++evaluations[d.context];
    std::string& list = reused[d.context];
    if (!d.computed) list += (list.empty() ? "" : ",") + std::to_string(step);
  }
  std::string text = reused["cond"].empty() ? "none" : reused["cond"];
  if (evaluations.count("uncond") > 0)
    text += "; uncond: " + (reused["uncond"].empty() ? std::string("none") : reused["uncond"]);
  metadata["cache_reused"] = text;
  if (!cache.calibrated_mag_ratios().empty()) {
    std::ostringstream ratios;
    for (size_t i = 0; i < cache.calibrated_mag_ratios().size(); ++i)
      ratios << (i ? "," : "") << cache.calibrated_mag_ratios()[i];
    metadata["mag_ratios"] = ratios.str();
  }
}

}  // namespace

PipelineOutput DiffusionPipeline::denoise_and_decode(
    const pipelines::TaskCall& task, const pipelines::TaskStart& start,
    const std::function<Tensor(const Tensor&, int, float)>& model_output,
    const std::function<Tensor(const Tensor&)>& decode, bool negative,
    std::map<std::string, std::string> extra, const pipelines::CallControl& control) {
  // The call's own schedule: the loop keeps a stateful sampler's history in it, never in the pipeline's.
  std::unique_ptr<Scheduler> schedule = task.schedule.clone();
  // The call's step cache, its every context's state fresh (diffusers resets them after each call).
  nn::StepCache* cache = denoiser_cache();
  if (cache != nullptr) cache->reset(call_cache(task.request), task.call.num_inference_steps);
  // Every evaluation's timestep reaches the cache first (diffusers' pipe.current_timestep, which Pyramid
  // Attention Broadcast's and FasterCache's ranges read), whatever the family.
  const auto timed_output = [&](const Tensor& x, int step, float timestep) {
    if (cache != nullptr) cache->set_timestep(timestep);
    return model_output(x, step, timestep);
  };
  const Tensor latents = pipelines::denoise(
      start.latents, {.scheduler = schedule.get(),
                      .start_step = start.start_step,
                      .end_step = start.end_step,
                      .model_output = timed_output,
                      .noise = pipelines::noise_draw(task.generators),
                      .blend = start.blend,
                      .on_step_end = task.request.callback_on_step_end,
                      .checkpoint = [&](const std::string& where) { control.checkpoint(where); }});
  // The denoiser's memory handed on (model offload): the transformer, or the UNet, whatever its component
  // name.
  nn::Module* const denoiser_module = &denoiser();
  std::string denoiser_name = "transformer";
  for (const auto& [component, module] : components())
    if (module == denoiser_module) denoiser_name = component;
  release_after_use({{denoiser_name.c_str(), denoiser_module}});
  if (task.request.output_type == OutputType::Latent) return pipelines::latent_output(task, latents);

  control.checkpoint("before decoding");
  const Tensor images = decode(latents);
  release_after_use({{"vae", component_named(*this, "vae")}});
  std::map<std::string, std::string> metadata = pipelines::call_metadata(task, name_, dtype_, negative);
  for (auto& [key, value] : extra) metadata[key] = std::move(value);
  if (cache != nullptr && cache->active()) step_cache_metadata(*cache, start.start_step, metadata);
  return pipelines::task_output(task, start, images, std::move(metadata), negative);
}

}  // namespace kiln
