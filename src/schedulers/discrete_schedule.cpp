// DiscreteScheduleConfig (which keys each class reads, its defaults, what Kiln refuses) and the shared base.
#include "kiln/schedulers/discrete_schedule.h"

#include <cmath>
#include <initializer_list>
#include <utility>

#include "kiln/core/error.h"
#include "kiln/io/json_config.h"
#include "schedulers/discrete_math.h"

namespace kiln {

using Kind = DiscreteSchedulerKind;

const char* class_name(DiscreteSchedulerKind kind) {
  switch (kind) {
    case Kind::Euler:
      return "EulerDiscreteScheduler";
    case Kind::EulerAncestral:
      return "EulerAncestralDiscreteScheduler";
    case Kind::DPMSolverMultistep:
      return "DPMSolverMultistepScheduler";
    case Kind::DDIM:
      return "DDIMScheduler";
    case Kind::PNDM:
      return "PNDMScheduler";
  }
  return "?";
}

namespace {

bool is_one_of(Kind kind, std::initializer_list<Kind> kinds) {
  for (Kind k : kinds)
    if (k == kind) return true;
  return false;
}

// The value of string key `key` among `choices` (name -> value); anything else throws listing them.
template <class E>
E choice(const io::JsonConfig& v, const std::string& key, E fallback,
         std::initializer_list<std::pair<const char*, E>> choices, const char* cls) {
  if (!v.has(key)) return fallback;
  const std::string got = v.get<std::string>(key);
  std::string names;
  for (const auto& [name, value] : choices) {
    if (got == name) return value;
    names += std::string(names.empty() ? "" : ", ") + "\"" + name + "\"";
  }
  KILN_FAIL(v.where(key) << ": " << cls << " in Kiln supports " << names << ", got \"" << got << "\"");
}

// A key whose only supported value is `expected` (diffusers has others Kiln does not implement).
void require_bool(const io::JsonConfig& v, const std::string& key, bool expected, const char* cls,
                  const char* why) {
  if (!v.has(key)) return;
  KILN_CHECK(v.get<bool>(key) == expected, v.where(key)
                                               << ": " << cls << " in Kiln supports only " << key << " = "
                                               << (expected ? "true" : "false") << " (" << why << ")");
}

void require_string(const io::JsonConfig& v, const std::string& key,
                    std::initializer_list<const char*> allowed, const char* cls) {
  if (!v.has(key)) return;
  const std::string got = v.get<std::string>(key);
  std::string names;
  for (const char* a : allowed) {
    if (got == a) return;
    names += std::string(names.empty() ? "" : ", ") + "\"" + a + "\"";
  }
  KILN_FAIL(v.where(key) << ": " << cls << " in Kiln supports " << names << ", got \"" << got << "\"");
}

}  // namespace

DiscreteScheduleConfig DiscreteScheduleConfig::defaults(DiscreteSchedulerKind kind) {
  DiscreteScheduleConfig c;
  if (kind == Kind::DDIM || kind == Kind::PNDM) c.timestep_spacing = TimestepSpacing::Leading;
  if (kind == Kind::DDIM) {
    c.set_alpha_to_one = true;
    c.clip_sample = true;
  }
  return c;
}

DiscreteScheduleConfig DiscreteScheduleConfig::from_json(const io::JsonConfig& v,
                                                         DiscreteSchedulerKind kind) {
  const char* cls = class_name(kind);
  DiscreteScheduleConfig c = defaults(kind);
  c.num_train_timesteps = v.get_or<int64_t>("num_train_timesteps", c.num_train_timesteps);
  KILN_CHECK(c.num_train_timesteps >= 2 && c.num_train_timesteps <= (int64_t{1} << 24),
             v.where("num_train_timesteps")
                 << ": expected a value in [2, 2^24], got " << c.num_train_timesteps);
  c.beta_start = v.get_or<double>("beta_start", c.beta_start);
  c.beta_end = v.get_or<double>("beta_end", c.beta_end);
  KILN_CHECK(c.beta_start >= 0 && c.beta_end >= 0 && c.beta_start < 1 && c.beta_end < 1,
             v.origin() << ": " << cls << ": expected beta_start and beta_end in [0, 1), got " << c.beta_start
                        << " and " << c.beta_end);
  KILN_CHECK(!v.has("trained_betas"),
             v.where("trained_betas") << ": " << cls
                                      << " in Kiln does not take trained_betas (an explicit beta list); set "
                                         "it to null and give beta_schedule");
  c.beta_schedule = choice(v, "beta_schedule", c.beta_schedule,
                           {{"linear", BetaSchedule::Linear},
                            {"scaled_linear", BetaSchedule::ScaledLinear},
                            {"squaredcos_cap_v2", BetaSchedule::SquaredCosCapV2}},
                           cls);
  if (kind == Kind::EulerAncestral || kind == Kind::PNDM) {
    // diffusers' EulerAncestral raises NotImplementedError for "sample"; PNDM has epsilon and v only.
    c.prediction_type =
        choice(v, "prediction_type", c.prediction_type,
               {{"epsilon", PredictionType::Epsilon}, {"v_prediction", PredictionType::VPrediction}}, cls);
  } else {
    c.prediction_type = choice(v, "prediction_type", c.prediction_type,
                               {{"epsilon", PredictionType::Epsilon},
                                {"v_prediction", PredictionType::VPrediction},
                                {"sample", PredictionType::Sample}},
                               cls);
  }
  c.timestep_spacing = choice(v, "timestep_spacing", c.timestep_spacing,
                              {{"linspace", TimestepSpacing::Linspace},
                               {"leading", TimestepSpacing::Leading},
                               {"trailing", TimestepSpacing::Trailing}},
                              cls);
  c.steps_offset = v.get_or<int64_t>("steps_offset", c.steps_offset);
  KILN_CHECK(
      c.steps_offset >= 0 && c.steps_offset < c.num_train_timesteps,
      v.where("steps_offset") << ": expected a value in [0, num_train_timesteps), got " << c.steps_offset);
  if (kind != Kind::PNDM)
    require_bool(v, "rescale_betas_zero_snr", false, cls, "zero terminal SNR rescaling is not implemented");

  if (is_one_of(kind, {Kind::Euler, Kind::DPMSolverMultistep})) {
    c.use_karras_sigmas = v.get_or<bool>("use_karras_sigmas", c.use_karras_sigmas);
    require_bool(v, "use_exponential_sigmas", false, cls, "exponential sigmas are not implemented");
    require_bool(v, "use_beta_sigmas", false, cls, "beta sigmas are not implemented");
    c.final_sigmas_type =
        choice(v, "final_sigmas_type", c.final_sigmas_type,
               {{"zero", FinalSigmasType::Zero}, {"sigma_min", FinalSigmasType::SigmaMin}}, cls);
  }
  if (kind == Kind::Euler) {
    require_string(v, "interpolation_type", {"linear"}, cls);
    c.sigma_min = v.get_optional<double>("sigma_min");
    c.sigma_max = v.get_optional<double>("sigma_max");
    // "continuous" changes the timesteps only with v_prediction (0.25 * log sigma, as for CosXL / EDM
    // models).
    if (c.prediction_type == PredictionType::VPrediction)
      require_string(v, "timestep_type", {"discrete"}, cls);
  }
  if (kind == Kind::DPMSolverMultistep) {
    c.solver_order = v.get_or<int>("solver_order", c.solver_order);
    KILN_CHECK(c.solver_order == 1 || c.solver_order == 2,
               v.where("solver_order")
                   << ": " << cls << " in Kiln supports solver_order 1 or 2 (DPM++ 2M), got "
                   << c.solver_order);
    // diffusers maps "deis" to dpmsolver++ and the UniPC / DEIS solver types to midpoint.
    require_string(v, "algorithm_type", {"dpmsolver++", "deis"}, cls);
    c.solver_type = choice(v, "solver_type", c.solver_type,
                           {{"midpoint", DPMSolverType::Midpoint},
                            {"heun", DPMSolverType::Heun},
                            {"logrho", DPMSolverType::Midpoint},
                            {"bh1", DPMSolverType::Midpoint},
                            {"bh2", DPMSolverType::Midpoint}},
                           cls);
    c.lower_order_final = v.get_or<bool>("lower_order_final", c.lower_order_final);
    c.euler_at_final = v.get_or<bool>("euler_at_final", c.euler_at_final);
    require_bool(v, "thresholding", false, cls, "dynamic thresholding is not implemented");
    require_bool(v, "use_lu_lambdas", false, cls, "Lu's lambdas are not implemented");
    require_bool(v, "use_flow_sigmas", false, cls, "flow sigmas are not implemented");
    require_bool(v, "use_dynamic_shifting", false, cls, "dynamic shifting is not implemented");
    KILN_CHECK(!v.has("variance_type"), v.where("variance_type")
                                            << ": " << cls
                                            << " in Kiln supports only null (a model that "
                                               "predicts its variance is not supported)");
    if (v.has("lambda_min_clipped")) {
      const double clipped = v.get<double>("lambda_min_clipped");
      KILN_CHECK(std::isinf(clipped) && clipped < 0,
                 v.where("lambda_min_clipped")
                     << ": " << cls << " in Kiln supports only -inf (no clipping), got " << clipped);
    }
  }
  if (kind == Kind::DDIM) {
    c.clip_sample = v.get_or<bool>("clip_sample", c.clip_sample);
    c.clip_sample_range = v.get_or<double>("clip_sample_range", c.clip_sample_range);
    require_bool(v, "thresholding", false, cls, "dynamic thresholding is not implemented");
  }
  if (kind == Kind::DDIM || kind == Kind::PNDM)
    c.set_alpha_to_one = v.get_or<bool>("set_alpha_to_one", c.set_alpha_to_one);
  if (kind == Kind::PNDM)
    require_bool(v, "skip_prk_steps", true, cls,
                 "the Runge-Kutta warm-up steps are not implemented; Stable Diffusion's config skips them");
  return c;
}

DiscreteScheduler::DiscreteScheduler(DiscreteSchedulerKind kind, const DiscreteScheduleConfig& config)
    : config_(config), kind_(kind) {
  KILN_CHECK(
      config.num_train_timesteps >= 2 && config.num_train_timesteps <= (int64_t{1} << 24),
      class_name() << ": expected num_train_timesteps in [2, 2^24], got " << config.num_train_timesteps);
  KILN_CHECK(config.solver_order == 1 || config.solver_order == 2,
             class_name() << ": expected solver_order 1 or 2, got " << config.solver_order);
  alphas_cumprod_ = schedulers_detail::cumprod_of_one_minus(schedulers_detail::training_betas(config));
}

std::unique_ptr<DiscreteScheduler> DiscreteScheduler::clone_discrete() const {
  // Every DiscreteScheduler's clone() returns its own class.
  return std::unique_ptr<DiscreteScheduler>(static_cast<DiscreteScheduler*>(clone().release()));
}

int DiscreteScheduler::img2img_start_index(double strength) const {
  KILN_CHECK(requested_steps_ > 0, class_name() << "::img2img_start_index: call set_timesteps first");
  return kiln::img2img_start_index(requested_steps_, strength, order());
}

Tensor DiscreteScheduler::scale_model_input(const Tensor& sample, int step_index) const {
  check_step_index("scale_model_input", step_index);
  return sample;
}

void DiscreteScheduler::check_step_index(const char* what, int step_index) const {
  KILN_CHECK(!timesteps_.empty(), class_name() << "::" << what << ": call set_timesteps first");
  KILN_CHECK(step_index >= 0 && step_index < num_inference_steps(),
             class_name() << "::" << what << ": expected a step index in [0, " << num_inference_steps()
                          << "), got " << step_index);
}

void DiscreteScheduler::check_num_inference_steps(int n, bool at_most_train_steps) const {
  KILN_CHECK(n >= 1, class_name() << "::set_timesteps: expected num_inference_steps >= 1, got " << n);
  KILN_CHECK(!at_most_train_steps || n <= config_.num_train_timesteps,
             class_name() << "::set_timesteps: num_inference_steps " << n
                          << " is more than num_train_timesteps " << config_.num_train_timesteps);
}

int img2img_start_index(int num_inference_steps, double strength, int order) {
  KILN_CHECK(strength >= 0.0 && strength <= 1.0,
             "img2img_start_index: expected a strength in [0, 1], got " << strength);
  KILN_CHECK(num_inference_steps >= 1,
             "img2img_start_index: expected num_inference_steps >= 1, got " << num_inference_steps);
  // Python's int() truncates the float64 product.
  const int init =
      std::min(static_cast<int>(static_cast<double>(num_inference_steps) * strength), num_inference_steps);
  return std::max(num_inference_steps - init, 0) * order;
}

}  // namespace kiln
