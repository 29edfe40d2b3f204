// DDIMScheduler with eta = 0, following diffusers' scheduling_ddim.py: with eta = 0 the variance term
// (std_dev_t = eta * sqrt(variance)) is exactly 0 and no noise is added.
#include "kiln/schedulers/ddim.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/ops/elementwise.h"
#include "kiln/schedulers/timestep_shift.h"
#include "schedulers/discrete_math.h"
#include "schedulers/step_tensors.h"

namespace kiln {

using namespace schedulers_detail;

DDIMScheduler::DDIMScheduler(const DiscreteScheduleConfig& config)
    : DiscreteScheduler(DiscreteSchedulerKind::DDIM, config) {}

void DDIMScheduler::set_timesteps(int n) {
  check_num_inference_steps(n, true);
  const int64_t t_train = config_.num_train_timesteps;
  timesteps_.clear();
  switch (config_.timestep_spacing) {
    case TimestepSpacing::Linspace: {
      const std::vector<double> v = linspace(0.0, static_cast<double>(t_train - 1), n);
      for (auto it = v.rbegin(); it != v.rend(); ++it)
        timesteps_.push_back(static_cast<float>(numpy_round(*it)));
      break;
    }
    case TimestepSpacing::Leading: {
      const int64_t ratio = t_train / n;
      for (int64_t i = n - 1; i >= 0; --i)
        timesteps_.push_back(static_cast<float>(i * ratio + config_.steps_offset));
      break;
    }
    case TimestepSpacing::Trailing: {
      const double ratio = static_cast<double>(t_train) / n;
      for (double v : numpy_arange(static_cast<double>(t_train), 0.0, -ratio))
        timesteps_.push_back(static_cast<float>(numpy_round(v) - 1));
      break;
    }
  }
  for (float t : timesteps_) {
    KILN_CHECK(t >= 0 && t < static_cast<float>(t_train),
               class_name() << "::set_timesteps: timestep " << t << " is outside the training schedule [0, "
                            << t_train << "); lower steps_offset");
  }
  requested_steps_ = n;
}

Tensor DDIMScheduler::step(const Tensor& model_output, int step_index, const Tensor& sample,
                           const NoiseDraw&) {
  check_step_index("step", step_index);
  check_same_shape_float(class_name(), "step", model_output, "model_output", sample, "sample");
  const int64_t t = static_cast<int64_t>(timesteps_[static_cast<size_t>(step_index)]);
  const int64_t prev_t = t - config_.num_train_timesteps / requested_steps_;
  const float a_t = alphas_cumprod_[static_cast<size_t>(t)];
  const float a_prev = prev_t >= 0 ? alphas_cumprod_[static_cast<size_t>(prev_t)]
                                   : (config_.set_alpha_to_one ? 1.0f : alphas_cumprod_.front());
  const float b_t = 1.0f - a_t;
  const double sqrt_a = std::sqrt(a_t);
  const double sqrt_b = std::sqrt(b_t);

  const Tensor x = as_float32(sample);
  const Tensor out = as_float32(model_output);
  Tensor x0;
  Tensor eps;
  switch (config_.prediction_type) {
    case PredictionType::Epsilon:
      x0 = div(sub(x, mul(out, sqrt_b)), sqrt_a);
      eps = out;
      break;
    case PredictionType::Sample:
      x0 = out;
      eps = div(sub(x, mul(x0, sqrt_a)), sqrt_b);
      break;
    case PredictionType::VPrediction:
      x0 = sub(mul(x, sqrt_a), mul(out, sqrt_b));
      eps = add(mul(out, sqrt_a), mul(x, sqrt_b));
      break;
  }
  if (config_.clip_sample) {
    const double r = static_cast<float>(config_.clip_sample_range);
    x0 = clamp(x0, -r, r);
  }
  const Tensor direction = mul(eps, static_cast<double>(std::sqrt(1.0f - a_prev)));
  return add(mul(x0, static_cast<double>(std::sqrt(a_prev))), direction).to(model_output.dtype());
}

Tensor DDIMScheduler::scale_noise(const Tensor& sample, int step_index, const Tensor& noise) const {
  check_step_index("scale_noise", step_index);
  check_same_shape_float(class_name(), "scale_noise", sample, "sample", noise, "noise");
  return add_alpha_noise(sample, noise,
                         alphas_cumprod_[static_cast<size_t>(timesteps_[static_cast<size_t>(step_index)])]);
}

std::unique_ptr<Scheduler> DDIMScheduler::clone() const {
  return std::make_unique<DDIMScheduler>(*this);
}

}  // namespace kiln
