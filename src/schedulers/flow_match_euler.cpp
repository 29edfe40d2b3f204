// FlowMatchEulerDiscreteScheduler, following diffusers' scheduling_flow_match_euler_discrete.py operation by
// operation. The arithmetic type of each step is the one numpy / torch use there:
//   __init__        float32 torch tensors (Python scalars become float32)
//   set_timesteps   with the pipeline's sigmas: float32 numpy (np.array(sigmas).astype(np.float32), Python
//                   scalars are "weak" under numpy 2 and become float32); without: float64 numpy
//                   (np.linspace)
//   conversion      torch.from_numpy(...).to(float32), then timesteps = sigmas * num_train_timesteps in
//   float32
// Every product that feeds an addition goes through rounded() so that no FMA merges the two roundings.
#include "kiln/schedulers/flow_match_euler.h"
#include "kiln/schedulers/timestep_shift.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/core/half.h"
#include "kiln/io/component_config.h"
#include "kiln/io/json_config.h"
#include "kiln/ops/elementwise.h"
#include "schedulers/rounded.h"

namespace kiln {

using schedulers_detail::rounded;

namespace {

constexpr const char* kClassName = "FlowMatchEulerDiscreteScheduler";

// shift * s / (1 + (shift - 1) * s): the static (resolution-independent) shift.
template <class T>
void apply_static_shift(std::vector<T>& s, double shift) {
  const T a = static_cast<T>(shift);
  const T b = static_cast<T>(shift - 1.0);
  for (T& v : s) v = rounded(a * v) / (T(1) + rounded(b * v));
}

// diffusers' time_shift(mu, 1.0, s): exp(mu) / (exp(mu) + (1/s - 1)^1) or mu / (mu + (1/s - 1)^1). The power
// with exponent 1.0 is the identity in numpy, so it is left out.
template <class T>
void apply_time_shift(std::vector<T>& s, double mu, TimeShiftType type) {
  const T m = static_cast<T>(type == TimeShiftType::Exponential ? std::exp(mu) : mu);
  for (T& v : s) v = m / (m + (T(1) / v - T(1)));
}

// diffusers' stretch_shift_to_terminal: rescale 1 - s so that the last sigma becomes `terminal`.
template <class T>
void apply_shift_terminal(std::vector<T>& s, double terminal) {
  std::vector<T> one_minus(s.size());
  for (size_t i = 0; i < s.size(); ++i) one_minus[i] = T(1) - s[i];
  const T scale = one_minus.back() / static_cast<T>(1.0 - terminal);
  for (size_t i = 0; i < s.size(); ++i) s[i] = T(1) - one_minus[i] / scale;
}

template <class T>
void shift_sigmas(std::vector<T>& s, const FlowMatchEulerConfig& c, double shift, std::optional<double> mu) {
  if (c.use_dynamic_shifting)
    apply_time_shift(s, *mu, c.time_shift_type);
  else
    apply_static_shift(s, shift);
  if (c.shift_terminal && *c.shift_terminal != 0.0) apply_shift_terminal(s, *c.shift_terminal);
}

bool is_supported_float(DType d) {
  return d == float32 || d == bfloat16 || d == float16;
}

template <class T>
float to_f32(T v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, bf16_t>)
    return bf16_to_f32(v);
  else
    return f16_to_f32(v);
}

template <class T>
T from_f32(float v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, bf16_t>)
    return f32_to_bf16(v);
  else
    return f32_to_f16(v);
}

// prev = float32(sample) + D(D(dt) * model_output), cast to D = model_output's dtype. In diffusers `dt` is a
// 0-dim float32 tensor, so torch treats it like a scalar operand of the model_output's dtype: it is rounded
// to D before the multiply, and the product is rounded to D (exact in float32 for 16-bit D) before the
// float32 add.
template <class Out, class In>
void euler_step(const Out* model_output, const In* sample, Out* out, int64_t n, float dt) {
  const float d = to_f32(from_f32<Out>(dt));
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) {
    const float product = to_f32(from_f32<Out>(rounded(d * to_f32(model_output[i]))));
    out[i] = from_f32<Out>(to_f32(sample[i]) + product);
  }
}

// sigma * noise + (1 - sigma) * sample in T, as torch computes it with sigma a T tensor: 1 - sigma, both
// products and the sum are each rounded to T.
template <class T>
void forward_process(const T* sample, const T* noise, T* out, int64_t n, float sigma) {
  const float s = to_f32(from_f32<T>(sigma));
  const float keep = to_f32(from_f32<T>(1.0f - s));
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) {
    const float noised = to_f32(from_f32<T>(rounded(s * to_f32(noise[i]))));
    const float kept = to_f32(from_f32<T>(rounded(keep * to_f32(sample[i]))));
    out[i] = from_f32<T>(noised + kept);
  }
}

// `value` rounded to `dtype`, as torch rounds a Python scalar that meets a tensor of that dtype.
double scalar_in(DType dtype, float value) {
  return Tensor::full({}, value, float32).to(dtype).item();
}

// On a device the same arithmetic as euler_step / forward_process runs as ops there (the latents never come
// back to the host): each product and sum rounded to the tensors' dtype, the scalars rounded first.
Tensor euler_step_ops(const Tensor& model_output, const Tensor& sample, float dt) {
  const Tensor product = mul(model_output, scalar_in(model_output.dtype(), dt));
  if (sample.dtype() == model_output.dtype()) return add(sample, product);
  return add(sample.to(float32), product.to(float32)).to(model_output.dtype());
}

Tensor forward_process_ops(const Tensor& sample, const Tensor& noise, float sigma) {
  const double s = scalar_in(sample.dtype(), sigma);
  return add(mul(noise, s), mul(sample, scalar_in(sample.dtype(), 1.0f - static_cast<float>(s))));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
FlowMatchEulerConfig FlowMatchEulerConfig::from_json(const io::JsonConfig& v) {
  FlowMatchEulerConfig c;
  c.num_train_timesteps = v.get_or<int64_t>("num_train_timesteps", c.num_train_timesteps);
  c.shift = v.get_or<double>("shift", c.shift);
  c.use_dynamic_shifting = v.get_or<bool>("use_dynamic_shifting", c.use_dynamic_shifting);
  // A key present with null is None in diffusers, an absent key keeps the default.
  if (v.contains("base_shift")) c.base_shift = v.get_optional<double>("base_shift");
  if (v.contains("max_shift")) c.max_shift = v.get_optional<double>("max_shift");
  c.base_image_seq_len = v.get_or<int64_t>("base_image_seq_len", c.base_image_seq_len);
  c.max_image_seq_len = v.get_or<int64_t>("max_image_seq_len", c.max_image_seq_len);
  c.invert_sigmas = v.get_or<bool>("invert_sigmas", c.invert_sigmas);
  c.shift_terminal = v.get_optional<double>("shift_terminal");
  c.use_karras_sigmas = v.get_or<bool>("use_karras_sigmas", false);
  c.use_exponential_sigmas = v.get_or<bool>("use_exponential_sigmas", false);
  c.use_beta_sigmas = v.get_or<bool>("use_beta_sigmas", false);
  const std::string type = v.get_or<std::string>("time_shift_type", "exponential");
  KILN_CHECK(type == "exponential" || type == "linear",
             v.where("time_shift_type")
                 << ": expected \"exponential\" or \"linear\", got \"" << type << "\"");
  c.time_shift_type = type == "linear" ? TimeShiftType::Linear : TimeShiftType::Exponential;
  c.stochastic_sampling = v.get_or<bool>("stochastic_sampling", false);
  return c;
}

FlowMatchEulerConfig FlowMatchEulerConfig::load(const std::string& path) {
  const io::ComponentConfig cc = io::load_scheduler_config(path);
  KILN_CHECK(cc.class_name == kClassName,
             cc.path << ": expected _class_name \"" << kClassName << "\", got \"" << cc.class_name << "\"");
  return from_json(cc.values);
}

// ---------------------------------------------------------------------------------------------------------
FlowMatchEulerDiscreteScheduler::FlowMatchEulerDiscreteScheduler(const FlowMatchEulerConfig& config)
    : config_(config), shift_(config.shift) {
  const char* unsupported = config.use_karras_sigmas        ? "use_karras_sigmas"
                            : config.use_exponential_sigmas ? "use_exponential_sigmas"
                            : config.use_beta_sigmas        ? "use_beta_sigmas"
                            : config.stochastic_sampling    ? "stochastic_sampling"
                                                            : nullptr;
  KILN_CHECK(unsupported == nullptr, kClassName
                                         << ": " << unsupported
                                         << " is not supported (Kiln implements the deterministic Euler "
                                            "sampler with shifted linear sigmas); set it to false");
  KILN_CHECK(config.num_train_timesteps >= 1 && config.num_train_timesteps <= (int64_t{1} << 24),
             kClassName << ": expected num_train_timesteps in [1, 2^24], got " << config.num_train_timesteps);
  KILN_CHECK(config.shift > 0.0 && std::isfinite(config.shift),
             kClassName << ": expected a positive shift, got " << config.shift);
  if (config.shift_terminal) {
    KILN_CHECK(*config.shift_terminal < 1.0,
               kClassName << ": expected shift_terminal < 1, got " << *config.shift_terminal);
  }

  // The training schedule: timesteps T..1 (np.linspace(1, T, T) reversed, exact integers), sigmas = t / T.
  const int64_t n = config.num_train_timesteps;
  const float t_train = static_cast<float>(n);
  std::vector<float> s(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) s[static_cast<size_t>(i)] = static_cast<float>(n - i) / t_train;
  // With dynamic shifting diffusers shifts later, per resolution.
  if (!config.use_dynamic_shifting) apply_static_shift(s, config.shift);
  sigma_max_ = s.front();
  sigma_min_ = s.back();
}

FlowMatchEulerDiscreteScheduler FlowMatchEulerDiscreteScheduler::from_pretrained(const std::string& path) {
  return FlowMatchEulerDiscreteScheduler(FlowMatchEulerConfig::load(path));
}

void FlowMatchEulerDiscreteScheduler::set_shift(double shift) {
  KILN_CHECK(shift > 0.0 && std::isfinite(shift),
             kClassName << "::set_shift: expected a positive shift, got " << shift);
  shift_ = shift;
}

void FlowMatchEulerDiscreteScheduler::set_timesteps(int num_inference_steps,
                                                    std::optional<std::vector<double>> sigmas,
                                                    std::optional<double> mu) {
  KILN_CHECK(num_inference_steps >= 1,
             kClassName << "::set_timesteps: expected num_inference_steps >= 1, got " << num_inference_steps);
  KILN_CHECK(!config_.use_dynamic_shifting || mu.has_value(),
             kClassName << "::set_timesteps: mu must be given when use_dynamic_shifting is true");
  KILN_CHECK(!mu || std::isfinite(*mu), kClassName << "::set_timesteps: expected a finite mu, got " << *mu);
  const size_t n = static_cast<size_t>(num_inference_steps);
  const double t_train = static_cast<double>(config_.num_train_timesteps);

  std::vector<float> s32(n);
  if (sigmas) {
    KILN_CHECK(sigmas->size() == n, kClassName << "::set_timesteps: expected " << n
                                               << " sigmas (one per step), got " << sigmas->size());
    for (size_t i = 0; i < n; ++i) {
      KILN_CHECK(std::isfinite((*sigmas)[i]), kClassName << "::set_timesteps: expected finite sigmas, got "
                                                         << (*sigmas)[i] << " at index " << i);
      s32[i] = static_cast<float>((*sigmas)[i]);
    }
    shift_sigmas(s32, config_, shift_, mu);
  } else {
    // np.linspace(sigma_max * T, sigma_min * T, n) / T, shifted in float64, then rounded to float32.
    std::vector<double> s = linspace(static_cast<double>(sigma_max_) * t_train,
                                     static_cast<double>(sigma_min_) * t_train, num_inference_steps);
    for (double& v : s) v = v / t_train;
    shift_sigmas(s, config_, shift_, mu);
    for (size_t i = 0; i < n; ++i) s32[i] = static_cast<float>(s[i]);
  }

  const float t_train_f = static_cast<float>(config_.num_train_timesteps);
  if (config_.invert_sigmas) {
    for (float& v : s32) v = 1.0f - v;
  }
  timesteps_.resize(n);
  for (size_t i = 0; i < n; ++i) timesteps_[i] = s32[i] * t_train_f;
  sigmas_ = s32;
  sigmas_.push_back(config_.invert_sigmas ? 1.0f : 0.0f);
}

std::unique_ptr<Scheduler> FlowMatchEulerDiscreteScheduler::clone() const {
  return std::make_unique<FlowMatchEulerDiscreteScheduler>(*this);
}

Tensor FlowMatchEulerDiscreteScheduler::step(const Tensor& model_output, int step_index, const Tensor& sample,
                                             const NoiseDraw&) {
  KILN_CHECK(!timesteps_.empty(), kClassName << "::step: call set_timesteps before step");
  KILN_CHECK(step_index >= 0 && step_index < num_inference_steps(),
             kClassName << "::step: expected a step index in [0, " << num_inference_steps() << "), got "
                        << step_index);
  KILN_CHECK(model_output.shape() == sample.shape(),
             kClassName << "::step: model_output " << shape_str(model_output.shape()) << " and sample "
                        << shape_str(sample.shape()) << " must have the same shape");
  KILN_CHECK(is_supported_float(model_output.dtype()) && is_supported_float(sample.dtype()),
             kClassName << "::step: expected float32, bfloat16 or float16 tensors, got model_output "
                        << dtype_name(model_output.dtype()) << " and sample " << dtype_name(sample.dtype()));

  const float dt = sigmas_[static_cast<size_t>(step_index) + 1] - sigmas_[static_cast<size_t>(step_index)];
  if (sample.device().type != DeviceType::CPU || model_output.device().type != DeviceType::CPU)
    return euler_step_ops(model_output, sample, dt);
  const Tensor mo = model_output.contiguous();
  const Tensor x = sample.contiguous();
  Tensor out = Tensor::empty(model_output.shape(), model_output.dtype());
  const int64_t n = out.numel();
  visit_dtype(mo.dtype(), [&](auto out_tag) {
    using Out = decltype(out_tag);
    if constexpr (std::is_same_v<Out, float> || std::is_same_v<Out, bf16_t> || std::is_same_v<Out, f16_t>) {
      visit_dtype(x.dtype(), [&](auto in_tag) {
        using In = decltype(in_tag);
        if constexpr (std::is_same_v<In, float> || std::is_same_v<In, bf16_t> || std::is_same_v<In, f16_t>) {
          euler_step(mo.data<Out>(), x.data<In>(), out.data<Out>(), n, dt);
        }
      });
    }
  });
  return out;
}

Tensor FlowMatchEulerDiscreteScheduler::scale_noise(const Tensor& sample, int step_index,
                                                    const Tensor& noise) const {
  KILN_CHECK(!timesteps_.empty(), kClassName << "::scale_noise: call set_timesteps before scale_noise");
  KILN_CHECK(step_index >= 0 && step_index < num_inference_steps(),
             kClassName << "::scale_noise: expected a step index in [0, " << num_inference_steps()
                        << "), got " << step_index);
  KILN_CHECK(sample.shape() == noise.shape() && sample.dtype() == noise.dtype(),
             kClassName << "::scale_noise: sample " << sample.str() << " and noise " << noise.str()
                        << " must have the same shape and dtype");
  KILN_CHECK(is_supported_float(sample.dtype()),
             kClassName << "::scale_noise: expected float32, bfloat16 or float16 tensors, got "
                        << dtype_name(sample.dtype()));
  const float sigma = sigmas_[static_cast<size_t>(step_index)];
  if (sample.device().type != DeviceType::CPU || noise.device().type != DeviceType::CPU)
    return forward_process_ops(sample, noise, sigma);
  const Tensor x = sample.contiguous();
  const Tensor z = noise.contiguous();
  Tensor out = Tensor::empty(sample.shape(), sample.dtype());
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>)
      forward_process(x.data<T>(), z.data<T>(), out.data<T>(), out.numel(), sigma);
  });
  return out;
}

double calculate_shift(const FlowMatchEulerConfig& config, int64_t image_seq_len, double max_shift) {
  return calculate_shift(image_seq_len, config.base_image_seq_len, config.max_image_seq_len,
                         config.base_shift.value_or(0.5), config.max_shift.value_or(max_shift));
}

}  // namespace kiln
