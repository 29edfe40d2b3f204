#include "families/stable_diffusion/unet_samplers.h"

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

std::string UNetSamplers::describe(const DiscreteScheduler& sampler) {
  return std::string(sampler.class_name()) + (sampler.config().use_karras_sigmas ? ", karras" : "");
}

}  // namespace kiln
