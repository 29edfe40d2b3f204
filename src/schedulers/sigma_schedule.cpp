// See sigma_schedule.h. Scalars are float32 as diffusers' 0-dim tensors are, and each tensor op rounds once
// to float32 (the ops are given float32-representable scalars, so their products are torch's).
#include "schedulers/sigma_schedule.h"

#include <algorithm>
#include <cmath>

#include "kiln/core/error.h"
#include "kiln/ops/elementwise.h"
#include "schedulers/discrete_math.h"

namespace kiln::schedulers_detail {

SigmaSchedule euler_schedule(const DiscreteScheduleConfig& c, const std::vector<float>& alphas_cumprod,
                             int n) {
  SigmaSchedule s;
  s.timesteps = euler_spacing(c, n);
  const std::vector<float> train = training_sigmas(alphas_cumprod);
  std::vector<double> sig =
      interp_on_index(std::vector<double>(s.timesteps.begin(), s.timesteps.end()), train);
  if (c.use_karras_sigmas) {
    // The ends are the interpolated sigmas of the first and last spaced timesteps unless the config sets
    // them.
    const std::vector<float> log_sigmas = log_of(train);
    sig = karras_sigmas(c.sigma_min.value_or(sig.back()), c.sigma_max.value_or(sig.front()), n);
    s.timesteps.clear();
    for (double v : sig) s.timesteps.push_back(static_cast<float>(sigma_to_t(v, log_sigmas)));
  }
  for (double v : sig) s.sigmas.push_back(static_cast<float>(v));
  s.sigmas.push_back(c.final_sigmas_type == FinalSigmasType::SigmaMin ? train.front() : 0.0f);
  return s;
}

double euler_init_noise_sigma(const std::vector<float>& sigmas, TimestepSpacing spacing) {
  KILN_CHECK(!sigmas.empty(), "init_noise_sigma: call set_timesteps first");
  const float max_sigma = *std::max_element(sigmas.begin(), sigmas.end());
  if (spacing == TimestepSpacing::Linspace || spacing == TimestepSpacing::Trailing) return max_sigma;
  return std::sqrt(max_sigma * max_sigma + 1.0f);
}

Tensor divide_by_sigma_norm(const Tensor& sample, float sigma) {
  return div(sample, static_cast<double>(std::sqrt(sigma * sigma + 1.0f)));
}

Tensor add_sigma_noise(const Tensor& sample, const Tensor& noise, float sigma) {
  return add(sample, mul(noise.to(sample.dtype()), static_cast<double>(sigma)));
}

Tensor euler_predicted_x0(PredictionType type, const Tensor& model_output, const Tensor& sample,
                          float sigma) {
  switch (type) {
    case PredictionType::Epsilon:
      return sub(sample, mul(model_output, static_cast<double>(sigma)));
    case PredictionType::VPrediction: {
      const float c_out = -sigma / std::sqrt(sigma * sigma + 1.0f);
      const float c_in = sigma * sigma + 1.0f;
      return add(mul(model_output, static_cast<double>(c_out)), div(sample, static_cast<double>(c_in)));
    }
    case PredictionType::Sample:
      return model_output;
  }
  throw Error("euler_predicted_x0: unknown prediction type");
}

}  // namespace kiln::schedulers_detail
