// What the two Euler samplers share: their schedule (timesteps and sigmas, as their set_timesteps compute
// it), the starting noise scale, the UNet input scaling and the forward process of a variance-exploding
// schedule.
#pragma once

#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/schedulers/discrete_schedule.h"

namespace kiln::schedulers_detail {

struct SigmaSchedule {
  std::vector<float> timesteps;  // float32, as passed to the UNet
  std::vector<float> sigmas;     // one per timestep plus the final sigma
};

// EulerDiscreteScheduler.set_timesteps (EulerAncestral's is the same without Karras sigmas and with a zero
// final sigma, which its config always has).
SigmaSchedule euler_schedule(const DiscreteScheduleConfig& config, const std::vector<float>& alphas_cumprod,
                             int num_inference_steps);
// max(sigmas), or sqrt(max^2 + 1) with "leading" spacing, in float32.
double euler_init_noise_sigma(const std::vector<float>& sigmas, TimestepSpacing spacing);
// sample / sqrt(sigma^2 + 1) in the sample's dtype.
Tensor divide_by_sigma_norm(const Tensor& sample, float sigma);
// sample + noise * sigma in the sample's dtype.
Tensor add_sigma_noise(const Tensor& sample, const Tensor& noise, float sigma);
// x0 predicted by an Euler sampler (float32 `sample`): epsilon sample - sigma * output; v_prediction
// output * (-sigma / sqrt(sigma^2 + 1)) + sample / (sigma^2 + 1); sample: the output itself.
Tensor euler_predicted_x0(PredictionType type, const Tensor& model_output, const Tensor& sample, float sigma);

}  // namespace kiln::schedulers_detail
