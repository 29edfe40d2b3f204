// Name -> class, and diffusers' from_config merge (base keys, then overrides) for the discrete samplers.
#include "kiln/schedulers/scheduler_factory.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/io/component_config.h"
#include "kiln/schedulers/ddim.h"
#include "kiln/schedulers/dpm_solver_multistep.h"
#include "kiln/schedulers/euler_ancestral_discrete.h"
#include "kiln/schedulers/euler_discrete.h"
#include "kiln/schedulers/pndm.h"

namespace kiln {

namespace {

using Kind = DiscreteSchedulerKind;

struct Named {
  const char* name;
  Kind kind;
  bool karras;  // dpmpp_2m_karras: use_karras_sigmas forced on
};

constexpr Named kNames[] = {
    {"EulerDiscreteScheduler", Kind::Euler, false},
    {"EulerAncestralDiscreteScheduler", Kind::EulerAncestral, false},
    {"DPMSolverMultistepScheduler", Kind::DPMSolverMultistep, false},
    {"DDIMScheduler", Kind::DDIM, false},
    {"PNDMScheduler", Kind::PNDM, false},
    {"euler", Kind::Euler, false},
    {"euler_a", Kind::EulerAncestral, false},
    {"dpmpp_2m", Kind::DPMSolverMultistep, false},
    {"dpmpp_2m_karras", Kind::DPMSolverMultistep, true},
    {"ddim", Kind::DDIM, false},
    {"pndm", Kind::PNDM, false},
};

std::string known_names() {
  std::string out;
  for (const Named& n : kNames) out += std::string(out.empty() ? "" : ", ") + n.name;
  return out;
}

const Named& named(const std::string& name, const std::string& context) {
  for (const Named& n : kNames)
    if (name == n.name) return n;
  KILN_FAIL(context << ": unknown scheduler \"" << name << "\"; Kiln's discrete schedulers are "
                    << known_names());
}

// base's keys, then overrides' keys over them; private keys ("_class_name", ...) are dropped as from_config
// drops them.
io::JsonConfig merged(const io::JsonConfig& base, const io::JsonConfig& overrides) {
  nlohmann::json out = nlohmann::json::object();
  for (const io::JsonConfig* part : {&base, &overrides}) {
    const nlohmann::json j = nlohmann::json::parse(part->dump());
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key().empty() || it.key()[0] != '_') out[it.key()] = it.value();
  }
  const std::string origin = overrides.keys().empty() ? base.origin() : base.origin() + " with overrides";
  return io::JsonConfig::parse(out.dump(), origin);
}

}  // namespace

std::unique_ptr<DiscreteScheduler> make_scheduler(DiscreteSchedulerKind kind,
                                                  const DiscreteScheduleConfig& config) {
  switch (kind) {
    case Kind::Euler:
      return std::make_unique<EulerDiscreteScheduler>(config);
    case Kind::EulerAncestral:
      return std::make_unique<EulerAncestralDiscreteScheduler>(config);
    case Kind::DPMSolverMultistep:
      return std::make_unique<DPMSolverMultistepScheduler>(config);
    case Kind::DDIM:
      return std::make_unique<DDIMScheduler>(config);
    case Kind::PNDM:
      return std::make_unique<PNDMScheduler>(config);
  }
  KILN_FAIL("make_scheduler: unknown scheduler kind");
}

io::JsonConfig load_scheduler_config_json(const std::string& folder_or_json) {
  const std::string path = io::config_file_in(folder_or_json, "scheduler_config.json");
  std::ifstream f(path);
  KILN_CHECK(f.good(), path << ": cannot open the scheduler config");
  std::stringstream text;
  text << f.rdbuf();
  // Python's json writes float("-inf") as -Infinity; DPMSolverMultistepScheduler saves its default
  // lambda_min_clipped so. Read as null, the value means the same default.
  static const std::regex minus_infinity(R"(("lambda_min_clipped"\s*:\s*)-Infinity)");
  return io::JsonConfig::parse(std::regex_replace(text.str(), minus_infinity, "$1null"), path);
}

std::unique_ptr<DiscreteScheduler> load_scheduler(const std::string& folder_or_json) {
  const io::JsonConfig values = load_scheduler_config_json(folder_or_json);
  const std::string cls = values.get<std::string>("_class_name");
  for (const Named& n : kNames) {
    if (cls == n.name) return make_scheduler(n.kind, DiscreteScheduleConfig::from_json(values, n.kind));
  }
  KILN_FAIL(values.where("_class_name")
            << ": \"" << cls
            << "\" is not one of Kiln's discrete schedulers (EulerDiscreteScheduler, "
               "EulerAncestralDiscreteScheduler, DPMSolverMultistepScheduler, "
               "DDIMScheduler, PNDMScheduler)");
}

std::unique_ptr<DiscreteScheduler> scheduler_from_config(const std::string& name,
                                                         const io::JsonConfig& base_config,
                                                         const io::JsonConfig& overrides) {
  const Named& n = named(name, "scheduler_from_config");
  io::JsonConfig values = merged(base_config, overrides);
  if (n.karras) values = merged(values, io::JsonConfig::parse(R"({"use_karras_sigmas": true})", name));
  return make_scheduler(n.kind, DiscreteScheduleConfig::from_json(values, n.kind));
}

std::unique_ptr<DiscreteScheduler> scheduler_from_config(const std::string& name,
                                                         const io::JsonConfig& base_config,
                                                         const std::string& overrides_json) {
  return scheduler_from_config(name, base_config,
                               io::JsonConfig::parse(overrides_json, "scheduler overrides"));
}

std::vector<std::string> scheduler_names() {
  std::vector<std::string> out;
  for (const Named& n : kNames) out.emplace_back(n.name);
  return out;
}

}  // namespace kiln
