// The DDPM-style discrete schedules of Stable Diffusion 1.5 / SDXL samplers (diffusers' EulerDiscrete,
// EulerAncestralDiscrete, DPMSolverMultistep, DDIM and PNDM schedulers): the scheduler_config.json they
// share (betas over num_train_timesteps training steps, the prediction type, how the inference timesteps are
// spaced) and the base class through which a pipeline sets any of them the same way.
//
// The training schedule is computed as diffusers does it, in float32 torch (torch.linspace's CPU kernel,
// cumprod accumulated in float64), so alphas_cumprod match diffusers bit for bit.
//
//   auto sched = kiln::load_scheduler("/path/stable-diffusion-v1-5/scheduler");   // scheduler_factory.h
//   sched->set_timesteps(25);
//   const int start = sched->img2img_start_index(0.6);   // image-to-image: steps [start, n)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/schedulers/scheduler.h"

namespace kiln {

namespace io {
class JsonConfig;
}

// The five classes; each reads only the config keys its diffusers class has (others are ignored, as
// diffusers' from_config ignores them) and has its class's defaults.
enum class DiscreteSchedulerKind { Euler, EulerAncestral, DPMSolverMultistep, DDIM, PNDM };
// The diffusers class name: "EulerDiscreteScheduler", ...
const char* class_name(DiscreteSchedulerKind kind);

enum class BetaSchedule { Linear, ScaledLinear, SquaredCosCapV2 };
enum class PredictionType { Epsilon, VPrediction, Sample };
enum class TimestepSpacing { Linspace, Leading, Trailing };
enum class FinalSigmasType { Zero, SigmaMin };
enum class DPMSolverType { Midpoint, Heun };

// The constructor arguments of the five classes that Kiln implements, with diffusers' defaults. Only
// supported values can be expressed: from_json refuses, naming the key, what the struct cannot hold
// (trained_betas, thresholding, rescale_betas_zero_snr, SDE / first-generation DPM-Solver, ...).
struct DiscreteScheduleConfig {
  int64_t num_train_timesteps = 1000;
  double beta_start = 0.0001;
  double beta_end = 0.02;
  BetaSchedule beta_schedule = BetaSchedule::Linear;
  PredictionType prediction_type = PredictionType::Epsilon;
  TimestepSpacing timestep_spacing = TimestepSpacing::Linspace;  // DDIM and PNDM: Leading
  int64_t steps_offset = 0;
  // DDIM / PNDM: the alpha product past the last step (1, or alphas_cumprod[0]). DDIM's default is true.
  bool set_alpha_to_one = false;
  // DDIM: clamp the predicted clean sample to [-clip_sample_range, clip_sample_range]. DDIM's default is
  // true.
  bool clip_sample = false;
  double clip_sample_range = 1.0;
  // Euler and DPM-Solver: Karras et al.'s sigmas (rho 7) between the schedule's ends; Euler's ends can be
  // overridden by sigma_min / sigma_max.
  bool use_karras_sigmas = false;
  std::optional<double> sigma_min;
  std::optional<double> sigma_max;
  FinalSigmasType final_sigmas_type = FinalSigmasType::Zero;
  // DPM-Solver++ (multistep): order 1 or 2, the second-order update, and when to fall back to first order.
  int solver_order = 2;
  DPMSolverType solver_type = DPMSolverType::Midpoint;
  bool lower_order_final = true;
  bool euler_at_final = false;

  // Defaults of `kind`'s class.
  static DiscreteScheduleConfig defaults(DiscreteSchedulerKind kind);
  // `kind`'s defaults overridden by the keys of `values` that its class has; absent or null keys keep the
  // defaults, other keys are ignored, and wrongly typed, unknown or unsupported values throw naming the key.
  static DiscreteScheduleConfig from_json(const io::JsonConfig& values, DiscreteSchedulerKind kind);
};

// What every discrete sampler shares: the training schedule, the inference timesteps and image-to-image's
// start. A pipeline gives each call its own clone() (multistep samplers keep history in it), calls
// set_timesteps(n), then scale_model_input / step for each step index in order.
class DiscreteScheduler : public Scheduler {
 public:
  DiscreteSchedulerKind kind() const { return kind_; }
  const char* class_name() const { return kiln::class_name(kind_); }
  const DiscreteScheduleConfig& config() const { return config_; }
  // float32, one per training timestep (the product of 1 - beta), as diffusers' alphas_cumprod.
  const std::vector<float>& alphas_cumprod() const { return alphas_cumprod_; }

  // clone() as a DiscreteScheduler, for a call that sets its own timesteps on the copy.
  std::unique_ptr<DiscreteScheduler> clone_discrete() const;
  // diffusers' set_timesteps(num_inference_steps): the schedule of a call; resets the sampler's history.
  virtual void set_timesteps(int num_inference_steps) = 0;
  // The timesteps as the UNet is given them (diffusers' int64 timesteps as exact floats). PNDM has one more
  // than the steps asked for (its first step is repeated).
  const std::vector<float>& timesteps() const override { return timesteps_; }
  // diffusers' scale_model_input: the sample itself (the Euler samplers override it).
  Tensor scale_model_input(const Tensor& sample, int step_index) const override;
  // The steps asked for in the last set_timesteps.
  int requested_steps() const { return requested_steps_; }
  // diffusers' scheduler.order (timesteps per model evaluation): 1 for the five classes.
  int order() const { return 1; }
  // Image-to-image (StableDiffusionImg2ImgPipeline.get_timesteps): the first step index to run for
  // `strength` in [0, 1], t_start * order with t_start = n - min(int(n * strength), n) and n the steps of
  // the last set_timesteps. The call runs steps [index, timesteps().size()) and noises its clean latents
  // with scale_noise(latents, index, noise).
  int img2img_start_index(double strength) const;

 protected:
  DiscreteScheduler(DiscreteSchedulerKind kind, const DiscreteScheduleConfig& config);
  // Throws unless set_timesteps was called and 0 <= step_index < timesteps().size(); `what` names the call.
  void check_step_index(const char* what, int step_index) const;
  // Throws unless n >= 1 (and, where the class requires it, n <= num_train_timesteps).
  void check_num_inference_steps(int num_inference_steps, bool at_most_train_steps) const;

  DiscreteScheduleConfig config_;
  std::vector<float> alphas_cumprod_;
  std::vector<float> timesteps_;
  int requested_steps_ = 0;

 private:
  DiscreteSchedulerKind kind_;
};

// StableDiffusionImg2ImgPipeline.get_timesteps' start index for `num_inference_steps` and `strength` (in
// [0, 1]) with a scheduler of `order`.
int img2img_start_index(int num_inference_steps, double strength, int order = 1);

}  // namespace kiln
