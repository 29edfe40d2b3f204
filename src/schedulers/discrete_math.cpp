// See discrete_math.h. rounded() keeps products that feed an addition from being fused into one FMA where
// numpy computes them with two roundings.
#include "schedulers/discrete_math.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kiln/core/error.h"
#include "kiln/schedulers/timestep_shift.h"
#include "schedulers/rounded.h"

namespace kiln::schedulers_detail {

std::vector<float> torch_linspace_f32(double start, double end, int64_t steps) {
  std::vector<float> out(static_cast<size_t>(steps));
  if (steps == 0) return out;
  const float s = static_cast<float>(start);
  const float e = static_cast<float>(end);
  if (steps == 1) {
    out[0] = s;
    return out;
  }
  const float step = (e - s) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  for (int64_t i = 0; i < steps; ++i) {
    out[static_cast<size_t>(i)] = i < halfway ? std::fma(step, static_cast<float>(i), s)
                                              : std::fma(-step, static_cast<float>(steps - 1 - i), e);
  }
  return out;
}

namespace {

// betas_for_alpha_bar with the cosine schedule (Python floats), rounded to float32 by torch.tensor.
std::vector<float> cosine_betas(int64_t n) {
  const auto alpha_bar = [](double t) {
    const double c = std::cos((t + 0.008) / 1.008 * std::numbers::pi / 2);
    return c * c;
  };
  std::vector<float> betas(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double t1 = static_cast<double>(i) / static_cast<double>(n);
    const double t2 = static_cast<double>(i + 1) / static_cast<double>(n);
    betas[static_cast<size_t>(i)] = static_cast<float>(std::min(1 - alpha_bar(t2) / alpha_bar(t1), 0.999));
  }
  return betas;
}

}  // namespace

std::vector<float> training_betas(const DiscreteScheduleConfig& c) {
  switch (c.beta_schedule) {
    case BetaSchedule::Linear:
      return torch_linspace_f32(c.beta_start, c.beta_end, c.num_train_timesteps);
    case BetaSchedule::ScaledLinear: {
      // Python's beta ** 0.5 is pow(), then the float32 tensor is squared.
      std::vector<float> b =
          torch_linspace_f32(std::pow(c.beta_start, 0.5), std::pow(c.beta_end, 0.5), c.num_train_timesteps);
      for (float& v : b) v = v * v;
      return b;
    }
    case BetaSchedule::SquaredCosCapV2:
      return cosine_betas(c.num_train_timesteps);
  }
  throw Error("training_betas: unknown beta schedule");
}

std::vector<float> cumprod_of_one_minus(const std::vector<float>& betas) {
  std::vector<float> out(betas.size());
  double acc = 1.0;
  for (size_t i = 0; i < betas.size(); ++i) {
    acc *= static_cast<double>(1.0f - betas[i]);
    out[i] = static_cast<float>(acc);
  }
  return out;
}

std::vector<float> training_sigmas(const std::vector<float>& alphas_cumprod) {
  std::vector<float> out(alphas_cumprod.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = std::sqrt((1.0f - alphas_cumprod[i]) / alphas_cumprod[i]);
  return out;
}

double numpy_round(double v) {
  return std::nearbyint(v);  // the default rounding mode rounds halves to even, as numpy does
}

std::vector<double> numpy_arange(double start, double stop, double step) {
  const double len = std::ceil((stop - start) / step);
  std::vector<double> out(len > 0 ? static_cast<size_t>(len) : 0);
  if (out.empty()) return out;
  out[0] = start;
  if (out.size() == 1) return out;
  // numpy stores start and start + step, then fills with start + i * (their difference).
  const double second = start + step;
  const double delta = second - start;
  out[1] = second;
  for (size_t i = 2; i < out.size(); ++i) out[i] = start + rounded(static_cast<double>(i) * delta);
  return out;
}

std::vector<double> interp_on_index(const std::vector<double>& x, const std::vector<float>& fp) {
  const size_t n = fp.size();
  std::vector<double> out(x.size());
  for (size_t k = 0; k < x.size(); ++k) {
    const double v = x[k];
    if (v >= static_cast<double>(n - 1)) {
      out[k] = fp[n - 1];
    } else if (v <= 0.0) {
      out[k] = fp[0];
    } else {
      const size_t j = static_cast<size_t>(std::floor(v));
      const double lo = fp[j];
      if (static_cast<double>(j) == v) {
        out[k] = lo;
      } else {
        const double slope = (static_cast<double>(fp[j + 1]) - lo) / 1.0;
        out[k] = rounded(slope * (v - static_cast<double>(j))) + lo;
      }
    }
  }
  return out;
}

std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int n) {
  constexpr double rho = 7.0;
  const std::vector<double> ramp = linspace(0.0, 1.0, n);
  const double min_inv_rho = std::pow(sigma_min, 1 / rho);
  const double max_inv_rho = std::pow(sigma_max, 1 / rho);
  std::vector<double> out(ramp.size());
  for (size_t i = 0; i < ramp.size(); ++i)
    out[i] = std::pow(max_inv_rho + rounded(ramp[i] * (min_inv_rho - max_inv_rho)), rho);
  return out;
}

std::vector<float> log_of(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = std::log(v[i]);
  return out;
}

double sigma_to_t(double sigma, const std::vector<float>& log_sigmas) {
  const double log_sigma = std::log(std::max(sigma, 1e-10));
  // argmax(cumsum(log_sigma - log_sigmas >= 0)): the last index where the training log sigma is <= ours
  // (0 when there is none), then at most len - 2.
  size_t low = 0;
  for (size_t i = 0; i < log_sigmas.size(); ++i)
    if (log_sigma - static_cast<double>(log_sigmas[i]) >= 0) low = i;
  low = std::min(low, log_sigmas.size() - 2);
  const float lo = log_sigmas[low];
  const float hi = log_sigmas[low + 1];
  // low - high is a float32 subtraction in numpy (both are float32 scalars).
  double w = (static_cast<double>(lo) - log_sigma) / static_cast<double>(lo - hi);
  w = std::clamp(w, 0.0, 1.0);
  return rounded((1 - w) * static_cast<double>(low)) + rounded(w * static_cast<double>(low + 1));
}

std::vector<float> euler_spacing(const DiscreteScheduleConfig& c, int n) {
  const int64_t t_train = c.num_train_timesteps;
  std::vector<float> out;
  switch (c.timestep_spacing) {
    case TimestepSpacing::Linspace: {
      // np.linspace(0, T - 1, n, dtype=np.float32)[::-1]: float64 values cast to float32.
      const std::vector<double> v = linspace(0.0, static_cast<double>(t_train - 1), n);
      for (auto it = v.rbegin(); it != v.rend(); ++it) out.push_back(static_cast<float>(*it));
      break;
    }
    case TimestepSpacing::Leading: {
      const int64_t ratio = t_train / n;
      for (int64_t i = n - 1; i >= 0; --i)
        out.push_back(static_cast<float>(i * ratio) + static_cast<float>(c.steps_offset));
      break;
    }
    case TimestepSpacing::Trailing: {
      const double ratio = static_cast<double>(t_train) / n;
      for (double v : numpy_arange(static_cast<double>(t_train), 0.0, -ratio))
        out.push_back(static_cast<float>(numpy_round(v)) - 1.0f);
      break;
    }
  }
  return out;
}

}  // namespace kiln::schedulers_detail
