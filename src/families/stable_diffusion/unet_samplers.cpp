#include "families/stable_diffusion/unet_samplers.h"

#include <algorithm>
#include <cmath>

#include "kiln/core/error.h"
#include "kiln/schedulers/scheduler_factory.h"

namespace kiln {

namespace {

// The sampler a request names (the folder's class when it only asks for Karras sigmas), built from the
// folder's config as diffusers' from_config swaps it.
std::unique_ptr<DiscreteScheduler> named(const PipelineRequest& request, const std::string& folder_class,
                                         const io::JsonConfig& folder_config) {
  const std::string name = request.scheduler.value_or(folder_class);
  std::unique_ptr<DiscreteScheduler> sampler;
  try {
    sampler = request.use_karras_sigmas
                  ? scheduler_from_config(name, folder_config,
                                          std::string(R"({"use_karras_sigmas": )") +
                                              (*request.use_karras_sigmas ? "true" : "false") + "}")
                  : scheduler_from_config(name, folder_config);
  } catch (const RequestError&) {
    throw;
  } catch (const Error& e) {
    throw RequestError("scheduler", e.what());
  }
  if (request.use_karras_sigmas && *request.use_karras_sigmas) {
    const DiscreteSchedulerKind kind = sampler->kind();
    if (kind != DiscreteSchedulerKind::Euler && kind != DiscreteSchedulerKind::DPMSolverMultistep)
      throw RequestError("use_karras_sigmas", std::string("use_karras_sigmas: ") + sampler->class_name() +
                                                  " has no Karras sigmas (EulerDiscreteScheduler and "
                                                  "DPMSolverMultistepScheduler have)");
  }
  return sampler;
}

bool swaps(const PipelineRequest& request) {
  return request.scheduler.has_value() || request.use_karras_sigmas.has_value();
}

}  // namespace

UNetSamplers::UNetSamplers(const std::string& folder)
    : folder_(folder),
      class_name_(load_scheduler(folder)->class_name()),
      config_(load_scheduler_config_json(folder)) {}

void UNetSamplers::check(const PipelineRequest& request) const {
  if (swaps(request)) named(request, class_name_, config_);
}

std::unique_ptr<DiscreteScheduler> UNetSamplers::for_call(const PipelineRequest& request, int steps) const {
  std::unique_ptr<DiscreteScheduler> sampler =
      swaps(request) ? named(request, class_name_, config_) : scheduler_from_config(class_name_, config_);
  sampler->set_timesteps(steps);
  return sampler;
}

namespace {

int64_t discrete_cutoff(const DiscreteScheduler& sampler, double fraction) {
  const double t = static_cast<double>(sampler.config().num_train_timesteps);
  // Python's round() rounds halves to even, as std::nearbyint does in the default rounding mode.
  return static_cast<int64_t>(std::nearbyint(t - fraction * t));
}

}  // namespace

int UNetSamplers::denoising_start_step(const DiscreteScheduler& sampler, double denoising_start) {
  const int64_t cutoff = discrete_cutoff(sampler, denoising_start);
  const std::vector<float>& timesteps = sampler.timesteps();
  int below = 0;
  for (float t : timesteps) below += static_cast<double>(t) < static_cast<double>(cutoff) ? 1 : 0;
  if (sampler.order() == 2 && below % 2 == 0) ++below;
  return std::max(static_cast<int>(timesteps.size()) - below, 0);
}

int UNetSamplers::denoising_end_step(const DiscreteScheduler& sampler, double denoising_end, int start) {
  const int64_t cutoff = discrete_cutoff(sampler, denoising_end);
  const std::vector<float>& timesteps = sampler.timesteps();
  int kept = 0;
  for (size_t i = static_cast<size_t>(start); i < timesteps.size(); ++i)
    kept += static_cast<double>(timesteps[i]) >= static_cast<double>(cutoff) ? 1 : 0;
  return start + kept;
}

std::string UNetSamplers::describe(const DiscreteScheduler& sampler) {
  return std::string(sampler.class_name()) + (sampler.config().use_karras_sigmas ? ", karras" : "");
}

}  // namespace kiln
