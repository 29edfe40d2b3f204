// EulerDiscreteScheduler, following diffusers' scheduling_euler_discrete.py with s_churn = 0 (no noise):
// gamma = 0 and sigma_hat = sigma.
#include "kiln/schedulers/euler_discrete.h"

#include "kiln/core/error.h"
#include "kiln/ops/elementwise.h"
#include "schedulers/sigma_schedule.h"
#include "schedulers/step_tensors.h"

namespace kiln {

using namespace schedulers_detail;

EulerDiscreteScheduler::EulerDiscreteScheduler(const DiscreteScheduleConfig& config)
    : DiscreteScheduler(DiscreteSchedulerKind::Euler, config) {}

void EulerDiscreteScheduler::set_timesteps(int num_inference_steps) {
  check_num_inference_steps(num_inference_steps, false);
  SigmaSchedule s = euler_schedule(config_, alphas_cumprod_, num_inference_steps);
  timesteps_ = std::move(s.timesteps);
  sigmas_ = std::move(s.sigmas);
  requested_steps_ = num_inference_steps;
}

double EulerDiscreteScheduler::init_noise_sigma() const {
  return euler_init_noise_sigma(sigmas_, config_.timestep_spacing);
}

Tensor EulerDiscreteScheduler::scale_model_input(const Tensor& sample, int step_index) const {
  check_step_index("scale_model_input", step_index);
  return divide_by_sigma_norm(sample, sigmas_[static_cast<size_t>(step_index)]);
}

Tensor EulerDiscreteScheduler::step(const Tensor& model_output, int step_index, const Tensor& sample,
                                    const NoiseDraw&) {
  check_step_index("step", step_index);
  check_same_shape_float(class_name(), "step", model_output, "model_output", sample, "sample");
  const float sigma = sigmas_[static_cast<size_t>(step_index)];
  const Tensor x = as_float32(sample);
  const Tensor x0 = euler_predicted_x0(config_.prediction_type, as_float32(model_output), x, sigma);
  const Tensor derivative = div(sub(x, x0), static_cast<double>(sigma));
  const float dt = sigmas_[static_cast<size_t>(step_index) + 1] - sigma;
  return add(x, mul(derivative, static_cast<double>(dt))).to(model_output.dtype());
}

Tensor EulerDiscreteScheduler::scale_noise(const Tensor& sample, int step_index, const Tensor& noise) const {
  check_step_index("scale_noise", step_index);
  check_same_shape_float(class_name(), "scale_noise", sample, "sample", noise, "noise");
  return add_sigma_noise(sample, noise, sigmas_[static_cast<size_t>(step_index)]);
}

std::unique_ptr<Scheduler> EulerDiscreteScheduler::clone() const {
  return std::make_unique<EulerDiscreteScheduler>(*this);
}

}  // namespace kiln
