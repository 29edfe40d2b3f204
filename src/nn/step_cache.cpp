#include "kiln/nn/step_cache.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <type_traits>

#include "kiln/core/error.h"
#include "kiln/dist/process_group.h"
#include "kiln/ops.h"

namespace kiln {

namespace {

constexpr const char* kForms =
    "fbcache:THRESHOLD (First Block Cache, e.g. fbcache:0.12), magcache:THRESHOLD[:max_skip=N][:retention=R]"
    "[:ratios=R1,R2,...] or magcache:calibrate (MagCache), taylorseer[:interval=N][:warmup=N][:order=N]"
    "[:until=N][:factors=bf16|f32] (TaylorSeer), pab[:skip=N][:range=LOW,HIGH] (Pyramid Attention Broadcast, "
    "e.g. pab:skip=2:range=100,800), fastercache[:skip=N][:range=LOW,HIGH][:weight=W] (FasterCache, e.g. "
    "fastercache:skip=2:range=-1,681:weight=0.5), or none";

// A finite number >= 0 from `text`; throws naming `spec` and `what`.
double number_in(const std::string& spec, const std::string& text, const char* what) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  KILN_CHECK(
      !text.empty() && end == text.c_str() + text.size() && errno == 0 && std::isfinite(value) && value >= 0,
      "step cache '" << spec << "': " << what << " must be a finite number >= 0, got '" << text << "' ("
                     << kForms << ")");
  return value;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

MagCacheConfig parse_mag_cache(const std::string& spec, const std::vector<std::string>& parts) {
  MagCacheConfig config;
  KILN_CHECK(parts.size() >= 2, "step cache '" << spec << "': expected " << kForms);
  if (parts[1] == "calibrate" && parts.size() == 2) {
    config.calibrate = true;
    return config;
  }
  config.threshold = number_in(spec, parts[1], "the threshold");
  for (size_t i = 2; i < parts.size(); ++i) {
    const size_t equals = parts[i].find('=');
    const std::string key = parts[i].substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : parts[i].substr(equals + 1);
    if (key == "max_skip") {
      const double n = number_in(spec, value, "max_skip");
      KILN_CHECK(
          n == std::floor(n) && n <= 1000,
          "step cache '" << spec << "': max_skip must be a whole number of steps, got '" << value << "'");
      config.max_skip_steps = static_cast<int>(n);
    } else if (key == "retention") {
      config.retention_ratio = number_in(spec, value, "retention");
      KILN_CHECK(config.retention_ratio <= 1,
                 "step cache '" << spec << "': retention is a fraction of the steps, at most 1");
    } else if (key == "ratios") {
      for (const std::string& r : split(value, ','))
        config.mag_ratios.push_back(number_in(spec, r, "a ratio"));
      KILN_CHECK(config.mag_ratios.size() <= 10000, "step cache '" << spec << "': more than 10000 ratios");
    } else {
      KILN_FAIL("step cache '" << spec << "': unknown option '" << key << "' (" << kForms << ")");
    }
  }
  return config;
}

// A whole number from 0 to `max`.
int whole_in(const std::string& spec, const std::string& text, const char* what, int max) {
  const double n = number_in(spec, text, what);
  KILN_CHECK(n == std::floor(n) && n <= max, "step cache '" << spec << "': " << what
                                                            << " must be a whole number up to " << max
                                                            << ", got '" << text << "'");
  return static_cast<int>(n);
}

TaylorSeerCacheConfig parse_taylorseer(const std::string& spec, const std::vector<std::string>& parts) {
  TaylorSeerCacheConfig config;
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t equals = parts[i].find('=');
    const std::string key = parts[i].substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : parts[i].substr(equals + 1);
    if (key == "interval") {
      config.cache_interval = whole_in(spec, value, "interval", 1000);
      KILN_CHECK(config.cache_interval >= 1, "step cache '" << spec << "': interval must be at least 1");
    } else if (key == "warmup") {
      config.disable_cache_before_step = whole_in(spec, value, "warmup", 1000);
      KILN_CHECK(config.disable_cache_before_step >= 1,
                 "step cache '" << spec << "': warmup must be at least 1 (a forecast needs a computed step)");
    } else if (key == "until") {
      config.disable_cache_after_step = whole_in(spec, value, "until", 1000);
    } else if (key == "order") {
      config.max_order = whole_in(spec, value, "order", 8);
    } else if (key == "factors" && (value == "bf16" || value == "f32")) {
      config.factors_dtype = value == "bf16" ? bfloat16 : float32;
    } else {
      KILN_FAIL("step cache '" << spec << "': unknown option '" << parts[i] << "' (" << kForms << ")");
    }
  }
  return config;
}

// A finite number (of either sign) from `text`; throws naming `spec` and `what`.
double signed_number_in(const std::string& spec, const std::string& text, const char* what) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  KILN_CHECK(!text.empty() && end == text.c_str() + text.size() && errno == 0 && std::isfinite(value),
             "step cache '" << spec << "': " << what << " must be a finite number, got '" << text << "' ("
                            << kForms << ")");
  return value;
}

// "LOW,HIGH": a timestep range.
std::pair<double, double> range_in(const std::string& spec, const std::string& text) {
  const std::vector<std::string> ends = split(text, ',');
  KILN_CHECK(ends.size() == 2, "step cache '" << spec << "': range must be two timesteps LOW,HIGH (e.g. "
                                              << "range=100,800), got '" << text << "'");
  return {signed_number_in(spec, ends[0], "the range's low end"),
          signed_number_in(spec, ends[1], "the range's high end")};
}

// "pab[:skip=N][:range=LOW,HIGH]" and "fastercache[:skip=N][:range=LOW,HIGH][:weight=W]": the options both
// read, and FasterCache's weight.
template <typename Config>
Config parse_attention_cache(const std::string& spec, const std::vector<std::string>& parts) {
  Config config;
  try {
    for (size_t i = 1; i < parts.size(); ++i) {
      const size_t equals = parts[i].find('=');
      const std::string key = parts[i].substr(0, equals);
      const std::string value = equals == std::string::npos ? "" : parts[i].substr(equals + 1);
      if (key == "skip" && equals != std::string::npos) {
        config.spatial_attention_block_skip_range = whole_in(spec, value, "skip", 1000);
      } else if (key == "range" && equals != std::string::npos) {
        config.spatial_attention_timestep_skip_range = range_in(spec, value);
      } else if constexpr (std::is_same_v<Config, FasterCacheConfig>) {
        KILN_CHECK(key == "weight" && equals != std::string::npos,
                   "step cache '" << spec << "': unknown option '" << parts[i] << "'");
        config.attention_weight = signed_number_in(spec, value, "weight");
      } else {
        KILN_FAIL("step cache '" << spec << "': unknown option '" << parts[i] << "'");
      }
    }
    check_step_cache(config);
  } catch (const Error& e) {
    // Every refusal names the spec and the forms a spec takes.
    const std::string what = e.what();
    const std::string named = what.find("step cache '") == 0 ? what : "step cache '" + spec + "': " + what;
    KILN_FAIL(named << (what.find(kForms) == std::string::npos ? std::string(" (") + kForms + ")" : ""));
  }
  return config;
}

// diffusers' nearest_interp: `ratios` (float32) at `steps` points, index round(i * scale) in float32 with
// ties to even, as torch.round does.
std::vector<float> resampled(const std::vector<double>& ratios, int steps) {
  std::vector<float> source(ratios.begin(), ratios.end());
  if (steps <= 0 || source.empty() || static_cast<size_t>(steps) == source.size()) return source;
  if (steps == 1) return {source.back()};
  const auto scale = static_cast<float>(static_cast<double>(source.size() - 1) / (steps - 1));
  std::vector<float> out;
  for (int i = 0; i < steps; ++i) {
    const float at = std::nearbyint(static_cast<float>(i) * scale);
    out.push_back(source[std::min(static_cast<size_t>(at), source.size() - 1)]);
  }
  return out;
}

}  // namespace

StepCacheConfig parse_step_cache(const std::string& spec) {
  const std::vector<std::string> parts = split(spec, ':');
  if (parts[0] == "magcache") return parse_mag_cache(spec, parts);
  if (parts[0] == "taylorseer") return parse_taylorseer(spec, parts);
  if (parts[0] == "pab") return parse_attention_cache<PyramidAttentionBroadcastConfig>(spec, parts);
  if (parts[0] == "fastercache") return parse_attention_cache<FasterCacheConfig>(spec, parts);
  KILN_CHECK(parts[0] == "fbcache" && parts.size() == 2, "step cache '" << spec << "': expected " << kForms);
  return FirstBlockCacheConfig{.threshold = number_in(spec, parts[1], "the threshold")};
}

std::string step_cache_spec(const StepCacheConfig& config) {
  std::ostringstream out;
  if (const auto* first = std::get_if<FirstBlockCacheConfig>(&config)) {
    out << "fbcache:" << first->threshold;
    return out.str();
  }
  if (const auto* taylor = std::get_if<TaylorSeerCacheConfig>(&config)) {
    out << "taylorseer:interval=" << taylor->cache_interval << ":warmup=" << taylor->disable_cache_before_step
        << ":order=" << taylor->max_order;
    if (taylor->disable_cache_after_step) out << ":until=" << *taylor->disable_cache_after_step;
    if (taylor->factors_dtype == float32) out << ":factors=f32";
    return out.str();
  }
  if (const auto* pab = std::get_if<PyramidAttentionBroadcastConfig>(&config)) {
    out << "pab:skip=" << pab->spatial_attention_block_skip_range
        << ":range=" << pab->spatial_attention_timestep_skip_range.first << ","
        << pab->spatial_attention_timestep_skip_range.second;
    return out.str();
  }
  if (const auto* faster = std::get_if<FasterCacheConfig>(&config)) {
    out << "fastercache:skip=" << faster->spatial_attention_block_skip_range
        << ":range=" << faster->spatial_attention_timestep_skip_range.first << ","
        << faster->spatial_attention_timestep_skip_range.second << ":weight=" << faster->attention_weight;
    return out.str();
  }
  const auto& mag = std::get<MagCacheConfig>(config);
  if (mag.calibrate) return "magcache:calibrate";
  out << "magcache:" << mag.threshold << ":max_skip=" << mag.max_skip_steps
      << ":retention=" << mag.retention_ratio;
  if (!mag.mag_ratios.empty()) {
    out << ":ratios=";
    for (size_t i = 0; i < mag.mag_ratios.size(); ++i) out << (i ? "," : "") << mag.mag_ratios[i];
  }
  return out.str();
}

namespace {

// The checks PAB's and FasterCache's configs share.
template <typename Config>
void check_attention_cache(const char* name, const Config& config) {
  const auto [low, high] = config.spatial_attention_timestep_skip_range;
  KILN_CHECK(config.spatial_attention_block_skip_range >= 1,
             name << ": spatial_attention_block_skip_range must be at least 1 (an attention runs at one "
                     "evaluation in that many), got "
                  << config.spatial_attention_block_skip_range);
  KILN_CHECK(
      std::isfinite(low) && std::isfinite(high) && low < high,
      name << ": spatial_attention_timestep_skip_range must be two finite timesteps, the low one first "
              "(e.g. 100, 800), got "
           << low << ", " << high);
}

}  // namespace

void check_step_cache(const StepCacheConfig& config) {
  if (const auto* pab = std::get_if<PyramidAttentionBroadcastConfig>(&config))
    check_attention_cache("Pyramid Attention Broadcast", *pab);
  if (const auto* faster = std::get_if<FasterCacheConfig>(&config)) {
    check_attention_cache("FasterCache", *faster);
    KILN_CHECK(std::isfinite(faster->attention_weight),
               "FasterCache: the attention weight must be a finite number, got " << faster->attention_weight);
    KILN_CHECK(
        faster->is_guidance_distilled,
        "FasterCache with is_guidance_distilled=false is not in Kiln: its unconditional-branch part "
        "approximates the negative half of a batch-concatenated classifier-free-guidance call from the "
        "positive half's frequencies, which needs one call of both halves and an image-shaped (B, C, H, "
        "W) transformer output; FLUX.1's and Qwen-Image's transformers output packed tokens and run true "
        "CFG's halves as two calls. Kiln has its attention part: is_guidance_distilled=true");
  }
}

const char* attention_step_cache_name(const StepCacheConfig& config) {
  if (std::holds_alternative<TaylorSeerCacheConfig>(config)) return "TaylorSeer";
  if (std::holds_alternative<PyramidAttentionBroadcastConfig>(config)) return "Pyramid Attention Broadcast";
  if (std::holds_alternative<FasterCacheConfig>(config)) return "FasterCache";
  return nullptr;
}

const std::vector<double>& flux_mag_ratios() {
  // The MagCache project's FLUX.1-dev ratios, as diffusers ships them (hooks/mag_cache.py).
  static const std::vector<double> ratios = {1.0,     1.21094, 1.11719, 1.07812, 1.0625,  1.03906, 1.03125,
                                             1.03906, 1.02344, 1.03125, 1.02344, 0.98047, 1.01562, 1.00781,
                                             1.0,     1.00781, 1.0,     1.00781, 1.0,     1.0,     0.99609,
                                             0.99609, 0.98047, 0.98828, 0.96484, 0.95703, 0.93359, 0.89062};
  return ratios;
}

namespace nn {

void StepCache::reset(const std::optional<StepCacheConfig>& call, int num_inference_steps) {
  active_ = call;
  num_inference_steps_ = num_inference_steps;
  context_ = "cond";
  states_.clear();
  mag_states_.clear();
  taylor_states_.clear();
  attention_states_.clear();
  in_evaluation_ = false;
  evaluations_.clear();
  decisions_.clear();
  calibrated_.clear();
  mag_ratios_.clear();
  if (const auto* mag = call ? std::get_if<MagCacheConfig>(&*call) : nullptr; mag && !mag->calibrate)
    mag_ratios_ =
        resampled(mag->mag_ratios.empty() ? published_mag_ratios_ : mag->mag_ratios, num_inference_steps);
}

bool StepCache::agreed(bool computed) {
  if (dist::world_size() <= 1) return computed;
  // The ranks' activations agree, but a decision must not hang on their last bit.
  uint8_t value = computed ? 1 : 0;
  dist::broadcast_from_rank0(&value, sizeof value);
  return value != 0;
}

namespace {

// diffusers' TaylorSeerCacheHook._measure_should_compute at evaluation `step` (from 0).
bool taylor_computes(const TaylorSeerCacheConfig& config, int step) {
  const int since = step - config.disable_cache_before_step - 1;
  const int interval = config.cache_interval;
  const bool warmup = step < config.disable_cache_before_step;
  const bool on_interval = ((since % interval) + interval) % interval == 0;  // Python's modulo
  const bool cooldown = config.disable_cache_after_step && step >= *config.disable_cache_after_step;
  return warmup || on_interval || cooldown;
}

}  // namespace

bool StepCache::forecasts_modules() const {
  return active_ && attention_step_cache_name(*active_) != nullptr;
}

void StepCache::count_attention(bool computed) {
  if (!in_evaluation_ || decisions_.empty()) return;
  Decision& d = decisions_.back();
  if (d.attentions_computed + d.attentions_reused == 0) d.computed = computed;
  (computed ? d.attentions_computed : d.attentions_reused) += 1;
}

std::vector<Tensor> StepCache::module_outputs(const void* key,
                                              const std::function<std::vector<Tensor>()>& compute) {
  if (!forecasts_modules()) return compute();
  if (const auto* taylor = std::get_if<TaylorSeerCacheConfig>(&*active_))
    return taylor_outputs(*taylor, key, compute);
  // diffusers' PAB and FasterCache hooks are not context-aware: one state per attention. (True CFG, whose two
  // evaluations would share it, is refused before the call.)
  AttentionState& state = attention_states_[key];
  if (const auto* pab = std::get_if<PyramidAttentionBroadcastConfig>(&*active_))
    return broadcast_outputs(*pab, state, compute);
  return faster_outputs(std::get<FasterCacheConfig>(*active_), state, compute);
}

namespace {

// diffusers' `low < current_timestep < high`: the float32 timestep against the ends (python numbers, which
// torch compares in the tensor's float32).
bool strictly_inside(const std::pair<double, double>& range, float timestep) {
  return static_cast<float>(range.first) < timestep && timestep < static_cast<float>(range.second);
}

}  // namespace

std::vector<Tensor> StepCache::broadcast_outputs(const PyramidAttentionBroadcastConfig& config,
                                                 AttentionState& state,
                                                 const std::function<std::vector<Tensor>()>& compute) {
  // diffusers' PyramidAttentionBroadcastHook.new_forward.
  const bool computes = state.latest.empty() || state.iteration == 0 ||
                        !strictly_inside(config.spatial_attention_timestep_skip_range, timestep_) ||
                        state.iteration % config.spatial_attention_block_skip_range == 0;
  if (computes) state.latest = compute();
  state.iteration += 1;
  count_attention(computes);
  return state.latest;
}

std::vector<Tensor> StepCache::faster_outputs(const FasterCacheConfig& config, AttentionState& state,
                                              const std::function<std::vector<Tensor>()>& compute) {
  // diffusers' FasterCacheBlockHook.new_forward, guidance-distilled: inside the range only the evaluations
  // whose index is a positive multiple of the skip range compute. (diffusers fails on an evaluation inside
  // the range with nothing cached yet, a range holding the first timestep; Kiln computes it.)
  const bool inside = strictly_inside(config.spatial_attention_timestep_skip_range, timestep_);
  const bool computes =
      !inside || state.latest.empty() ||
      (state.iteration > 0 && state.iteration % config.spatial_attention_block_skip_range == 0);
  std::vector<Tensor> outputs;
  if (computes) {
    outputs = compute();
  } else {
    // Each output of the module apart: t + (t - t_2) * weight, each operation in the outputs' dtype as
    // torch's is (a bfloat16 tensor times a python float stays bfloat16; the CPU kernels multiply by the
    // weight as a float32).
    const double weight = static_cast<float>(config.attention_weight);
    for (size_t i = 0; i < state.latest.size(); ++i)
      outputs.push_back(add(state.latest[i], mul(sub(state.latest[i], state.previous[i]), weight)));
  }
  // diffusers' cache [t_2, t]: [out, out] at the first evaluation, then [t, out] (an extrapolated output
  // counts as the next t).
  state.previous = state.latest.empty() ? outputs : state.latest;
  state.latest = outputs;
  state.iteration += 1;
  count_attention(computes);
  return outputs;
}

std::vector<Tensor> StepCache::taylor_outputs(const TaylorSeerCacheConfig& config, const void* key,
                                              const std::function<std::vector<Tensor>()>& compute) {
  TaylorState& state = taylor_states_[{context_, key}];
  state.current_step += 1;
  if (taylor_computes(config, state.current_step)) {
    std::vector<Tensor> outputs = compute();
    // diffusers' TaylorSeerState.update: divided differences up to max_order against the last factors (read
    // back in the outputs' dtype), all kept in the factors' dtype.
    std::vector<std::vector<Tensor>> factors;
    state.dtypes.clear();
    for (size_t i = 0; i < outputs.size(); ++i) {
      state.dtypes.push_back(outputs[i].dtype());
      std::vector<Tensor> next{outputs[i]};
      if (state.last_update_step && i < state.factors.size()) {
        const double delta = state.current_step - *state.last_update_step;
        const std::vector<Tensor>& previous = state.factors[i];
        for (size_t j = 0; j < static_cast<size_t>(config.max_order) && j < previous.size(); ++j) {
          if (previous[j].shape() != next[j].shape()) break;
          next.push_back(div(sub(next[j], previous[j].to(outputs[i].dtype())), delta));
        }
      }
      for (Tensor& f : next) f = f.to(config.factors_dtype);
      factors.push_back(std::move(next));
    }
    state.factors = std::move(factors);
    state.last_update_step = state.current_step;
    count_attention(true);
    return outputs;
  }
  // diffusers' TaylorSeerState.predict: the sum over the orders of factor * offset^order / order!, in the
  // outputs' dtype, from zeros.
  const double offset = state.current_step - *state.last_update_step;
  std::vector<Tensor> outputs;
  for (size_t i = 0; i < state.factors.size(); ++i) {
    const DType dtype = state.dtypes[i];
    const Tensor& first = state.factors[i][0];
    Tensor out = Tensor::zeros(first.shape(), dtype, first.device());
    double factorial = 1;
    for (size_t order = 0; order < state.factors[i].size(); ++order) {
      if (order > 0) factorial *= static_cast<double>(order);
      out = add(out, mul(state.factors[i][order].to(dtype),
                         std::pow(offset, static_cast<double>(order)) / factorial));
    }
    outputs.push_back(out);
  }
  count_attention(false);
  return outputs;
}

BlockStreams StepCache::run(size_t count, const BlockStreams& in, const RunBlocks& run_blocks) {
  if (active_) {
    const std::string why = refusal(*active_);
    KILN_CHECK(why.empty(), "step cache " << step_cache_spec(*active_) << ": " << why);
  }
  if (!active_ || count < 2) return run_blocks(0, count, in);
  if (const auto* first = std::get_if<FirstBlockCacheConfig>(&*active_))
    return run_first_block(*first, count, in, run_blocks);
  if (forecasts_modules()) {
    // The attentions decide for themselves (module_outputs), each counted in the evaluation's Decision (its
    // `computed` the first attention's). TaylorSeer's schedule is the config's alone, recorded here too.
    Decision decision{context_, true, -1};
    if (const auto* taylor = std::get_if<TaylorSeerCacheConfig>(&*active_))
      decision.computed = taylor_computes(*taylor, evaluations_[context_]++);
    decisions_.push_back(decision);
    in_evaluation_ = true;
    try {
      BlockStreams out = run_blocks(0, count, in);
      in_evaluation_ = false;
      return out;
    } catch (...) {
      in_evaluation_ = false;
      throw;
    }
  }
  return run_mag(std::get<MagCacheConfig>(*active_), count, in, run_blocks);
}

BlockStreams StepCache::run_first_block(const FirstBlockCacheConfig& config, size_t count,
                                        const BlockStreams& in, const RunBlocks& run_blocks) {
  const BlockStreams head = run_blocks(0, 1, in);
  const Tensor residual = sub(head.image, in.image);
  FirstBlockState& state = states_[context_];
  Decision decision{context_, true, -1};
  if (state.head_residual.defined()) {
    // diffusers: (residual - previous).abs().mean() / previous.abs().mean(), in the model's dtype, read as a
    // Python float and compared with the threshold.
    const Tensor change = div(mean(abs(sub(residual, state.head_residual))), mean(abs(state.head_residual)));
    decision.change = change.item();
    decision.computed = decision.change > config.threshold;
  }
  decision.computed = agreed(decision.computed);
  decisions_.push_back(decision);

  if (!decision.computed) {
    // diffusers: the cached residual + the first block's output, for each stream it has.
    BlockStreams out{add(state.tail_image, head.image), head.text};
    if (head.text.defined() && state.tail_text.defined()) out.text = add(state.tail_text, head.text);
    return out;
  }
  BlockStreams tail = run_blocks(1, count, head);
  state.head_residual = residual;
  state.tail_image = sub(tail.image, head.image);
  state.tail_text = tail.text.defined() && head.text.defined() ? sub(tail.text, head.text) : Tensor();
  return tail;
}

BlockStreams StepCache::run_mag(const MagCacheConfig& config, size_t count, const BlockStreams& in,
                                const RunBlocks& run_blocks) {
  MagState& state = mag_states_[context_];
  Decision decision{context_, true, -1};
  if (!config.calibrate) {
    // diffusers' MagCacheHeadHook, its arithmetic in float32 (its ratios are a float32 tensor).
    const int step = state.step_index;
    const float scale =
        step < static_cast<int>(mag_ratios_.size()) ? mag_ratios_[static_cast<size_t>(step)] : 1.0f;
    const int retention_step = static_cast<int>(config.retention_ratio * num_inference_steps_ + 0.5);
    if (step >= retention_step) {
      state.accumulated_ratio *= scale;
      state.accumulated_steps += 1;
      state.accumulated_err += std::fabs(1.0f - state.accumulated_ratio);
      decision.change = state.accumulated_err;
      if (state.previous_residual.defined() &&
          state.accumulated_err <= static_cast<float>(config.threshold) &&
          state.accumulated_steps <= config.max_skip_steps) {
        decision.computed = false;
      } else {
        state.accumulated_ratio = 1;
        state.accumulated_steps = 0;
        state.accumulated_err = 0;
      }
    }
  }
  decision.computed = agreed(decision.computed);
  decisions_.push_back(decision);

  // diffusers' _advance_step: after the call's last step the state starts again (the calibration is done).
  const auto advance = [&] {
    if (++state.step_index < num_inference_steps_) return;
    if (config.calibrate && context_ == "cond") calibrated_ = state.calibration;
    state = MagState{};
  };
  if (!decision.computed) {
    // The blocks' input plus the last residual; the text stream as it came in.
    BlockStreams out{add(in.image, state.previous_residual), in.text};
    advance();
    return out;
  }
  BlockStreams out = run_blocks(0, count, in);
  const Tensor residual = sub(out.image, in.image);
  if (config.calibrate) {
    double ratio = 1.0;
    if (state.previous_residual.defined()) {
      // diffusers: mean over the tokens of |r|_2 / (|r_prev|_2 + 1e-8), the norms over the channels, in
      // float32.
      const auto norms = [](const Tensor& r) { return sqrt(sum(square(r.to(float32)), {-1})); };
      ratio = mean(div(norms(residual), add(norms(state.previous_residual), 1e-8))).item();
    }
    state.calibration.push_back(ratio);
  }
  state.previous_residual = residual;
  advance();
  return out;
}

}  // namespace nn
}  // namespace kiln
