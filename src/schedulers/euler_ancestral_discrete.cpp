// EulerAncestralDiscreteScheduler, following diffusers' scheduling_euler_ancestral_discrete.py: the step
// splits the move to the next sigma into a deterministic part down to sigma_down and fresh noise of
// standard deviation sigma_up, with sigma_down^2 + sigma_up^2 = sigma_next^2.
#include "kiln/schedulers/euler_ancestral_discrete.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/ops/elementwise.h"
#include "schedulers/sigma_schedule.h"
#include "schedulers/step_tensors.h"

namespace kiln {

using namespace schedulers_detail;

EulerAncestralDiscreteScheduler::EulerAncestralDiscreteScheduler(const DiscreteScheduleConfig& config)
    : DiscreteScheduler(DiscreteSchedulerKind::EulerAncestral, config) {
  // The class has neither option in diffusers; a config built in C++ must not ask for them.
  KILN_CHECK(
      !config.use_karras_sigmas && config.final_sigmas_type == FinalSigmasType::Zero,
      class_name() << ": use_karras_sigmas and final_sigmas_type sigma_min are not options of this class");
  KILN_CHECK(config.prediction_type != PredictionType::Sample,
             class_name() << ": prediction_type \"sample\" is not implemented (as in diffusers)");
}

void EulerAncestralDiscreteScheduler::set_timesteps(int num_inference_steps) {
  check_num_inference_steps(num_inference_steps, false);
  SigmaSchedule s = euler_schedule(config_, alphas_cumprod_, num_inference_steps);
  timesteps_ = std::move(s.timesteps);
  sigmas_ = std::move(s.sigmas);
  requested_steps_ = num_inference_steps;
}

double EulerAncestralDiscreteScheduler::init_noise_sigma() const {
  return euler_init_noise_sigma(sigmas_, config_.timestep_spacing);
}

Tensor EulerAncestralDiscreteScheduler::scale_model_input(const Tensor& sample, int step_index) const {
  check_step_index("scale_model_input", step_index);
  return divide_by_sigma_norm(sample, sigmas_[static_cast<size_t>(step_index)]);
}

Tensor EulerAncestralDiscreteScheduler::step(const Tensor& model_output, int step_index, const Tensor& sample,
                                             const NoiseDraw& noise) {
  check_step_index("step", step_index);
  check_same_shape_float(class_name(), "step", model_output, "model_output", sample, "sample");
  KILN_CHECK(noise != nullptr, class_name()
                                   << "::step: ancestral sampling adds fresh noise at every step; give "
                                      "step() a NoiseDraw (the call's generators)");
  const float sigma = sigmas_[static_cast<size_t>(step_index)];
  const float sigma_to = sigmas_[static_cast<size_t>(step_index) + 1];
  const Tensor x = as_float32(sample);
  const Tensor x0 = euler_predicted_x0(config_.prediction_type, as_float32(model_output), x, sigma);

  const float to2 = sigma_to * sigma_to;
  const float from2 = sigma * sigma;
  const float sigma_up = std::sqrt(to2 * (from2 - to2) / from2);
  const float sigma_down = std::sqrt(to2 - sigma_up * sigma_up);
  const Tensor derivative = div(sub(x, x0), static_cast<double>(sigma));
  const Tensor moved = add(x, mul(derivative, static_cast<double>(sigma_down - sigma)));
  const Tensor fresh = noise(model_output.shape(), model_output.dtype());
  KILN_CHECK(fresh.shape() == model_output.shape(), class_name() << "::step: the noise drawn has shape "
                                                                 << shape_str(fresh.shape()) << ", expected "
                                                                 << shape_str(model_output.shape()));
  const Tensor z = as_float32(fresh).to(moved.device());
  return add(moved, mul(z, static_cast<double>(sigma_up))).to(model_output.dtype());
}

Tensor EulerAncestralDiscreteScheduler::scale_noise(const Tensor& sample, int step_index,
                                                    const Tensor& noise) const {
  check_step_index("scale_noise", step_index);
  check_same_shape_float(class_name(), "scale_noise", sample, "sample", noise, "noise");
  return add_sigma_noise(sample, noise, sigmas_[static_cast<size_t>(step_index)]);
}

std::unique_ptr<Scheduler> EulerAncestralDiscreteScheduler::clone() const {
  return std::make_unique<EulerAncestralDiscreteScheduler>(*this);
}

}  // namespace kiln
