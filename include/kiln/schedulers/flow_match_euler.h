// FlowMatchEulerDiscreteScheduler: diffusers' flow-matching Euler sampler, used by FLUX.1, FLUX.2 and SD3.
// The schedule (sigmas, timesteps) is computed with the same float32 / float64 arithmetic diffusers uses
// (float32 numpy when the pipeline passes sigmas, float64 numpy when it does not, float32 torch for the
// final conversion), so the values match diffusers to the last bit; step() follows torch's dtype path.
//
//   auto sched = kiln::FlowMatchEulerDiscreteScheduler::from_pretrained("/path/FLUX.1-dev/scheduler");
//   sched.set_timesteps(28, kiln::flux_sigmas(28), kiln::calculate_shift(4096));
//   for (int i = 0; i < 28; ++i) latents = sched.step(transformer(latents, sched.timesteps()[i]), i,
//   latents);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/schedulers/scheduler.h"
#include "kiln/schedulers/timestep_shift.h"

namespace kiln {

namespace io {
class JsonConfig;
}

enum class TimeShiftType { Exponential, Linear };

// The constructor arguments of diffusers' FlowMatchEulerDiscreteScheduler (the keys of
// scheduler_config.json), with diffusers' defaults.
struct FlowMatchEulerConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  std::optional<double> base_shift = 0.5;  // used by the pipelines' calculate_shift, not by the scheduler
  std::optional<double> max_shift = 1.15;
  int64_t base_image_seq_len = 256;
  int64_t max_image_seq_len = 4096;
  bool invert_sigmas = false;
  std::optional<double> shift_terminal;  // 0 counts as unset, as in diffusers
  bool use_karras_sigmas = false;        // the three sigma conversions and stochastic sampling are not
  bool use_exponential_sigmas = false;   // supported: the scheduler rejects them
  bool use_beta_sigmas = false;
  TimeShiftType time_shift_type = TimeShiftType::Exponential;
  bool stochastic_sampling = false;

  // From the parsed scheduler_config.json; absent or null keys keep the defaults, keys the scheduler does
  // not know ("_class_name", "_diffusers_version", ...) are ignored, and wrongly typed values throw.
  static FlowMatchEulerConfig from_json(const io::JsonConfig& values);
  // Reads scheduler_config.json (the file or the folder holding it); its "_class_name" must be
  // FlowMatchEulerDiscreteScheduler.
  static FlowMatchEulerConfig load(const std::string& path);
};

class FlowMatchEulerDiscreteScheduler final : public Scheduler {
 public:
  // Throws kiln::Error for options this implementation does not support (karras / exponential / beta
  // sigmas, stochastic sampling) and for invalid values (num_train_timesteps < 1, shift <= 0).
  explicit FlowMatchEulerDiscreteScheduler(const FlowMatchEulerConfig& config = {});
  static FlowMatchEulerDiscreteScheduler from_pretrained(const std::string& path);

  const FlowMatchEulerConfig& config() const { return config_; }
  // The training schedule's ends (diffusers' sigma_min / sigma_max), which set_timesteps spans when no
  // sigmas are given.
  float sigma_min() const { return sigma_min_; }
  float sigma_max() const { return sigma_max_; }
  double shift() const { return shift_; }
  void set_shift(double shift);  // as diffusers' set_shift: used by later set_timesteps calls

  // As diffusers' set_timesteps(num_inference_steps, sigmas=..., mu=...). `sigmas` (one per step, e.g.
  // flux_sigmas(n)) is given as the pipeline's float64 values and converted to float32 like numpy's astype;
  // when absent the scheduler spans [sigma_max, sigma_min] itself. `mu` is required with dynamic shifting
  // and ignored otherwise.
  void set_timesteps(int num_inference_steps, std::optional<std::vector<double>> sigmas = std::nullopt,
                     std::optional<double> mu = std::nullopt);

  // One per step, = sigma * num_train_timesteps (what the transformer is given, before its own scaling).
  const std::vector<float>& timesteps() const override { return timesteps_; }
  // One per step plus the terminal value (0, or 1 with invert_sigmas).
  const std::vector<float>& sigmas() const { return sigmas_; }

  // One Euler step at step `step_index` (0 .. num_inference_steps-1): sample + (sigma[i+1] - sigma[i]) *
  // model_output, with torch's dtype path: the difference is a float32 scalar rounded to model_output's
  // dtype, the product is rounded to that dtype, the sum is float32, and the result has model_output's dtype.
  // model_output and sample must have the same shape and a float32, bfloat16 or float16 dtype.
  Tensor step(const Tensor& model_output, int step_index, const Tensor& sample,
              const NoiseDraw& noise = {}) override;
  std::unique_ptr<Scheduler> clone() const override;
  // diffusers' scale_noise with the schedule's begin index at `step_index` (as its image-to-image pipelines
  // set it): sigma * noise + (1 - sigma) * sample, with sigma = sigmas[step_index] in the sample's dtype and
  // every product and the sum rounded to it, as torch computes it. `sample` and `noise` must have the same
  // shape and dtype (float32, bfloat16 or float16).
  Tensor scale_noise(const Tensor& sample, int step_index, const Tensor& noise) const override;

 private:
  FlowMatchEulerConfig config_;
  double shift_ = 1.0;
  float sigma_min_ = 0.0f;
  float sigma_max_ = 1.0f;
  std::vector<float> timesteps_;
  std::vector<float> sigmas_;
};

// The pipelines' mu for this scheduler at `image_seq_len` tokens (FluxPipeline's calculate_shift, which
// Chroma's and SD3's pipelines share): the config's sequence lengths and shifts, base_shift 0.5 and
// `max_shift` where the config gives none (null in its JSON).
double calculate_shift(const FlowMatchEulerConfig& config, int64_t image_seq_len, double max_shift = 1.15);

}  // namespace kiln
