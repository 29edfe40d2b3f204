// DPMSolverMultistepScheduler (dpmsolver++), following diffusers' scheduling_dpmsolver_multistep.py. The
// per-step coefficients are float32 scalars computed as diffusers computes its 0-dim tensors (log and exp of
// float32), and every tensor operation rounds to float32 in diffusers' order.
#include "kiln/schedulers/dpm_solver_multistep.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/ops/elementwise.h"
#include "kiln/schedulers/timestep_shift.h"
#include "schedulers/discrete_math.h"
#include "schedulers/step_tensors.h"

namespace kiln {

using namespace schedulers_detail;

namespace {

// _sigma_to_alpha_sigma_t and lambda = log(alpha_t) - log(sigma_t) at one sigma.
struct Level {
  float alpha;
  float sigma;
  float lambda;
};

Level level_of(float s) {
  const float alpha = 1.0f / std::sqrt(s * s + 1.0f);
  const float sigma = s * alpha;
  return {alpha, sigma, std::log(alpha) - std::log(sigma)};
}

Tensor scaled(const Tensor& t, float c) {
  return mul(t, static_cast<double>(c));
}

}  // namespace

DPMSolverMultistepScheduler::DPMSolverMultistepScheduler(const DiscreteScheduleConfig& config)
    : DiscreteScheduler(DiscreteSchedulerKind::DPMSolverMultistep, config) {}

void DPMSolverMultistepScheduler::set_timesteps(int n) {
  check_num_inference_steps(n, false);
  const int64_t t_train = config_.num_train_timesteps;
  std::vector<double> ts;  // int64 values in diffusers
  switch (config_.timestep_spacing) {
    case TimestepSpacing::Linspace: {
      // np.linspace(0, T - 1, n + 1).round()[::-1][:-1]
      const std::vector<double> v = linspace(0.0, static_cast<double>(t_train - 1), n + 1);
      for (size_t i = v.size() - 1; i >= 1; --i) ts.push_back(numpy_round(v[i]));
      break;
    }
    case TimestepSpacing::Leading: {
      const int64_t ratio = t_train / (n + 1);
      for (int64_t i = n; i >= 1; --i) ts.push_back(static_cast<double>(i * ratio + config_.steps_offset));
      break;
    }
    case TimestepSpacing::Trailing: {
      const double ratio = static_cast<double>(t_train) / n;
      for (double v : numpy_arange(static_cast<double>(t_train), 0.0, -ratio))
        ts.push_back(numpy_round(v) - 1);
      break;
    }
  }
  const std::vector<float> train = training_sigmas(alphas_cumprod_);
  std::vector<double> sig;
  if (config_.use_karras_sigmas) {
    // Between the training schedule's ends; the timesteps are rounded (truncated for the cosine schedule,
    // which diffusers leaves unrounded before its int64 conversion).
    const std::vector<float> log_sigmas = log_of(train);
    sig = karras_sigmas(train.front(), train.back(), n);
    ts.clear();
    for (double v : sig) {
      const double t = sigma_to_t(v, log_sigmas);
      ts.push_back(config_.beta_schedule == BetaSchedule::SquaredCosCapV2 ? std::trunc(t) : numpy_round(t));
    }
  } else {
    sig = interp_on_index(ts, train);
  }
  sigmas_.clear();
  for (double v : sig) sigmas_.push_back(static_cast<float>(v));
  sigmas_.push_back(config_.final_sigmas_type == FinalSigmasType::SigmaMin ? train.front() : 0.0f);
  timesteps_.assign(ts.begin(), ts.end());
  requested_steps_ = n;
  previous_x0_ = Tensor();
  lower_order_nums_ = 0;
  last_step_ = -1;
}

Tensor DPMSolverMultistepScheduler::step(const Tensor& model_output, int i, const Tensor& sample,
                                         const NoiseDraw&) {
  check_step_index("step", i);
  check_same_shape_float(class_name(), "step", model_output, "model_output", sample, "sample");
  KILN_CHECK(last_step_ < 0 || i == last_step_ + 1,
             class_name() << "::step: steps must be taken in order (multistep history): expected step "
                          << last_step_ + 1 << ", got " << i << "; call set_timesteps to start again");
  const int n = num_inference_steps();
  const DiscreteScheduleConfig& c = config_;
  const bool lower_order_final = i == n - 1 && (c.euler_at_final || (c.lower_order_final && n < 15) ||
                                                c.final_sigmas_type == FinalSigmasType::Zero);
  // diffusers' lower_order_second only matters for third-order solvers; with order 2 the second-order update
  // is the highest there is.

  // convert_model_output: the data prediction x0 at this step's sigma.
  const Tensor x = as_float32(sample);
  const Tensor out = as_float32(model_output);
  const Level s0 = level_of(sigmas_[static_cast<size_t>(i)]);
  Tensor x0;
  switch (c.prediction_type) {
    case PredictionType::Epsilon:
      x0 = div(sub(x, scaled(out, s0.sigma)), static_cast<double>(s0.alpha));
      break;
    case PredictionType::VPrediction:
      x0 = sub(scaled(x, s0.alpha), scaled(out, s0.sigma));
      break;
    case PredictionType::Sample:
      x0 = out;
      break;
  }

  const Level t = level_of(sigmas_[static_cast<size_t>(i) + 1]);
  const float h = t.lambda - s0.lambda;
  const float em1 = std::exp(-h) - 1.0f;  // exp(-h) - 1
  Tensor prev;
  if (c.solver_order == 1 || lower_order_nums_ < 1 || lower_order_final) {
    prev = sub(scaled(x, t.sigma / s0.sigma), scaled(x0, t.alpha * em1));
  } else {
    const Level s1 = level_of(sigmas_[static_cast<size_t>(i) - 1]);
    const float h0 = s0.lambda - s1.lambda;
    const float r0 = h0 / h;
    const Tensor d1 = scaled(sub(x0, previous_x0_), 1.0f / r0);
    const Tensor first = sub(scaled(x, t.sigma / s0.sigma), scaled(x0, t.alpha * em1));
    if (c.solver_type == DPMSolverType::Midpoint)
      prev = sub(first, scaled(d1, 0.5f * (t.alpha * em1)));
    else
      prev = add(first, scaled(d1, t.alpha * (em1 / h + 1.0f)));
  }
  previous_x0_ = x0;
  if (lower_order_nums_ < c.solver_order) ++lower_order_nums_;
  last_step_ = i;
  return prev.to(model_output.dtype());
}

Tensor DPMSolverMultistepScheduler::scale_noise(const Tensor& sample, int step_index,
                                                const Tensor& noise) const {
  check_step_index("scale_noise", step_index);
  check_same_shape_float(class_name(), "scale_noise", sample, "sample", noise, "noise");
  const Level l = level_of(sigmas_[static_cast<size_t>(step_index)]);
  return add(scaled(sample, l.alpha), scaled(noise.to(sample.dtype()), l.sigma));
}

std::unique_ptr<Scheduler> DPMSolverMultistepScheduler::clone() const {
  return std::make_unique<DPMSolverMultistepScheduler>(*this);
}

}  // namespace kiln
