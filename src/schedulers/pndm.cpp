// PNDMScheduler's PLMS path (skip_prk_steps), following diffusers' scheduling_pndm.py step_plms: the first
// update uses the model output alone, the repeated second timestep redoes it from the same sample with the
// average of the first two outputs, and later updates combine the last 2, 3 or 4 outputs with the
// Adams-Bashforth weights.
#include "kiln/schedulers/pndm.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/ops/elementwise.h"
#include "kiln/schedulers/timestep_shift.h"
#include "schedulers/discrete_math.h"
#include "schedulers/step_tensors.h"

namespace kiln {

using namespace schedulers_detail;

PNDMScheduler::PNDMScheduler(const DiscreteScheduleConfig& config)
    : DiscreteScheduler(DiscreteSchedulerKind::PNDM, config) {
  KILN_CHECK(config.prediction_type != PredictionType::Sample,
             class_name() << ": prediction_type \"sample\" is not supported (diffusers' PNDM has epsilon and "
                             "v_prediction)");
}

void PNDMScheduler::set_timesteps(int n) {
  check_num_inference_steps(n, false);
  const int64_t t_train = config_.num_train_timesteps;
  std::vector<int64_t> ts;  // ascending, diffusers' _timesteps
  switch (config_.timestep_spacing) {
    case TimestepSpacing::Linspace:
      for (double v : linspace(0.0, static_cast<double>(t_train - 1), n))
        ts.push_back(static_cast<int64_t>(numpy_round(v)));
      break;
    case TimestepSpacing::Leading: {
      const int64_t ratio = t_train / n;
      for (int64_t i = 0; i < n; ++i) ts.push_back(i * ratio + config_.steps_offset);
      break;
    }
    case TimestepSpacing::Trailing: {
      const double ratio = static_cast<double>(t_train) / n;
      const std::vector<double> v = numpy_arange(static_cast<double>(t_train), 0.0, -ratio);
      for (auto it = v.rbegin(); it != v.rend(); ++it)
        ts.push_back(static_cast<int64_t>(numpy_round(*it)) - 1);
      break;
    }
  }
  // plms_timesteps = concat(ts[:-1], ts[-2:-1], ts[-1:])[::-1]: the second-largest timestep twice.
  std::vector<int64_t> plms(ts.begin(), ts.end() - 1);
  if (ts.size() >= 2) plms.push_back(ts[ts.size() - 2]);
  plms.push_back(ts.back());
  timesteps_.clear();
  for (auto it = plms.rbegin(); it != plms.rend(); ++it) timesteps_.push_back(static_cast<float>(*it));
  requested_steps_ = n;
  ets_.clear();
  cur_sample_ = Tensor();
  counter_ = 0;
  last_step_ = -1;
}

Tensor PNDMScheduler::step(const Tensor& model_output, int step_index, const Tensor& sample,
                           const NoiseDraw&) {
  check_step_index("step", step_index);
  check_same_shape_float(class_name(), "step", model_output, "model_output", sample, "sample");
  KILN_CHECK(last_step_ < 0 || step_index == last_step_ + 1,
             class_name() << "::step: steps must be taken in order (multistep history): expected step "
                          << last_step_ + 1 << ", got " << step_index
                          << "; call set_timesteps to start again");
  const int64_t stride = config_.num_train_timesteps / requested_steps_;
  int64_t t = static_cast<int64_t>(timesteps_[static_cast<size_t>(step_index)]);
  int64_t prev_t = t - stride;
  const Tensor out = as_float32(model_output);
  Tensor x = as_float32(sample);
  if (counter_ != 1) {
    if (ets_.size() > 3) ets_.erase(ets_.begin(), ets_.end() - 3);
    ets_.push_back(out);
  } else {
    // The repeated timestep: the update from the first step's sample and timestep, redone.
    prev_t = t;
    t = t + stride;
  }

  Tensor m;
  const size_t k = ets_.size();
  if (k == 1 && counter_ == 0) {
    m = out;
    cur_sample_ = x;
  } else if (k == 1 && counter_ == 1) {
    m = div(add(out, ets_[0]), 2.0);
    x = cur_sample_;
    cur_sample_ = Tensor();
  } else if (k == 2) {
    m = div(sub(mul(ets_[1], 3.0), ets_[0]), 2.0);
  } else if (k == 3) {
    m = div(add(sub(mul(ets_[2], 23.0), mul(ets_[1], 16.0)), mul(ets_[0], 5.0)), 12.0);
  } else {
    const Tensor sum =
        sub(add(sub(mul(ets_[3], 55.0), mul(ets_[2], 59.0)), mul(ets_[1], 37.0)), mul(ets_[0], 9.0));
    m = mul(sum, static_cast<double>(static_cast<float>(1.0 / 24)));  // the Python float, rounded by torch
  }

  // _get_prev_sample
  KILN_CHECK(t >= 0 && t < config_.num_train_timesteps,
             class_name() << "::step: timestep " << t << " is outside the training schedule");
  const float a_t = alphas_cumprod_[static_cast<size_t>(t)];
  const float a_prev = prev_t >= 0 ? alphas_cumprod_[static_cast<size_t>(prev_t)]
                                   : (config_.set_alpha_to_one ? 1.0f : alphas_cumprod_.front());
  const float b_t = 1.0f - a_t;
  const float b_prev = 1.0f - a_prev;
  if (config_.prediction_type == PredictionType::VPrediction)
    m = add(mul(m, static_cast<double>(std::sqrt(a_t))), mul(x, static_cast<double>(std::sqrt(b_t))));
  const float sample_coeff = std::sqrt(a_prev / a_t);
  const float denom = a_t * std::sqrt(b_prev) + std::sqrt(a_t * b_t * a_prev);
  const Tensor prev = sub(mul(x, static_cast<double>(sample_coeff)),
                          div(mul(m, static_cast<double>(a_prev - a_t)), static_cast<double>(denom)));
  ++counter_;
  last_step_ = step_index;
  return prev.to(model_output.dtype());
}

Tensor PNDMScheduler::scale_noise(const Tensor& sample, int step_index, const Tensor& noise) const {
  check_step_index("scale_noise", step_index);
  check_same_shape_float(class_name(), "scale_noise", sample, "sample", noise, "noise");
  return add_alpha_noise(sample, noise,
                         alphas_cumprod_[static_cast<size_t>(timesteps_[static_cast<size_t>(step_index)])]);
}

std::unique_ptr<Scheduler> PNDMScheduler::clone() const {
  return std::make_unique<PNDMScheduler>(*this);
}

}  // namespace kiln
