// Discrete samplers by name, as diffusers' pipelines load and swap them:
//   load_scheduler(folder)                   pipe.scheduler = <_class_name>.from_pretrained(folder)
//   scheduler_from_config(name, base, ...)   pipe.scheduler = Class.from_config(pipe.scheduler.config, ...)
// A swap keeps the base config's keys (betas, steps_offset, prediction_type, ...) that the new class has;
// keys the new class does not have are ignored, keys the base config does not set take the new class's
// defaults (as diffusers records which values were defaults and drops them), and `overrides` win over both.
//
//   auto base = kiln::load_scheduler_config_json(model_dir + "/scheduler");
//   auto sched = kiln::scheduler_from_config("dpmpp_2m_karras", base);
//   sched->set_timesteps(25);
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/io/json_config.h"
#include "kiln/schedulers/discrete_schedule.h"

namespace kiln {

// The scheduler of a scheduler_config.json (the file or the folder holding it), by its "_class_name": one
// of the five discrete classes. Other classes (FlowMatchEulerDiscreteScheduler, LMS, UniPC, ...) throw
// naming the class and the ones supported.
std::unique_ptr<DiscreteScheduler> load_scheduler(const std::string& folder_or_json);
// The JSON object of a scheduler_config.json (file or folder), read as load_scheduler reads it: the
// `-Infinity` diffusers writes for DPM-Solver's lambda_min_clipped (not JSON) is read as null, its default.
io::JsonConfig load_scheduler_config_json(const std::string& folder_or_json);

// `name` built from another scheduler's config. Names: the five diffusers class names
// ("EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler", "DPMSolverMultistepScheduler",
// "DDIMScheduler", "PNDMScheduler") and the short names "euler", "euler_a", "dpmpp_2m", "dpmpp_2m_karras"
// (dpmpp_2m with use_karras_sigmas true), "ddim", "pndm". An unknown name throws listing these.
// `overrides` is a JSON object of constructor arguments (e.g. {"use_karras_sigmas": true}).
std::unique_ptr<DiscreteScheduler> scheduler_from_config(const std::string& name,
                                                         const io::JsonConfig& base_config,
                                                         const io::JsonConfig& overrides = io::JsonConfig());
// The same with the overrides as JSON text, e.g. R"({"use_karras_sigmas": true})".
std::unique_ptr<DiscreteScheduler> scheduler_from_config(const std::string& name,
                                                         const io::JsonConfig& base_config,
                                                         const std::string& overrides_json);
// The names scheduler_from_config accepts, class names first.
std::vector<std::string> scheduler_names();

// The sampler of `kind` from an already parsed config.
std::unique_ptr<DiscreteScheduler> make_scheduler(DiscreteSchedulerKind kind,
                                                  const DiscreteScheduleConfig& config);

}  // namespace kiln
