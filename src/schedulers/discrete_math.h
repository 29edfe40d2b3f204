// The numpy / torch computations behind diffusers' discrete schedules, each with the arithmetic type and
// operation order of the library call it stands for, so that the schedules match diffusers bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/schedulers/discrete_schedule.h"

namespace kiln::schedulers_detail {

// torch.linspace(start, end, steps, dtype=torch.float32) on the CPU: start, end and the step are float32 and
// each value is one fused multiply-add from the nearer end (the kernel's two halves).
std::vector<float> torch_linspace_f32(double start, double end, int64_t steps);
// The training betas of `config` (float32), and alphas_cumprod = cumprod(1 - betas) accumulated in float64 as
// torch's CPU cumprod does.
std::vector<float> training_betas(const DiscreteScheduleConfig& config);
std::vector<float> cumprod_of_one_minus(const std::vector<float>& betas);
// float32 ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5, index = training timestep.
std::vector<float> training_sigmas(const std::vector<float>& alphas_cumprod);

// numpy.round: halves to even.
double numpy_round(double v);
// numpy.arange(start, stop, step) in float64 (numpy's length and fill: start + i * (first step as stored)).
std::vector<double> numpy_arange(double start, double stop, double step);
// numpy.interp(x, arange(len(fp)), fp) in float64.
std::vector<double> interp_on_index(const std::vector<double>& x, const std::vector<float>& fp);
// _convert_to_karras: (max^(1/7) + ramp * (min^(1/7) - max^(1/7)))^7 over np.linspace(0, 1, n), float64.
std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int n);
// _sigma_to_t: the fractional training timestep of `sigma` by linear interpolation in log sigma, against
// `log_sigmas` = np.log of the float32 training sigmas.
double sigma_to_t(double sigma, const std::vector<float>& log_sigmas);
std::vector<float> log_of(const std::vector<float>& v);

// The inference timesteps of diffusers' three spacings as the Euler samplers compute them (float32; linspace
// is not rounded there).
std::vector<float> euler_spacing(const DiscreteScheduleConfig& config, int n);

}  // namespace kiln::schedulers_detail
