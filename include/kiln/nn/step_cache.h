// Step caching: skipping transformer work between neighbouring denoising steps, as diffusers'
// `transformer.enable_cache(config)` does (diffusers/hooks/). Kiln has three of diffusers' caches:
//
//   First Block Cache (FirstBlockCacheConfig): the first repeated block always runs; the rest run only when
//   the first block's residual (its output less its input) changed by more than `threshold` since the last
//   step that ran them, relative to that step's (mean |r - r_prev| / mean |r_prev|); otherwise the residuals
//   the rest added then are added to the first block's output.
//
//   MagCache (MagCacheConfig): the decision comes before any block, from the checkpoint's magnitude ratios
//   (how much the blocks' residual grows step to step, measured once by a calibration run): while the error
//   those ratios accumulate stays small, every block is skipped and the last residual added to their input.
//
// The same config gives diffusers' decisions, step by step, and its image.
//
//   pipe.transformer().enable_cache(kiln::FirstBlockCacheConfig{.threshold = 0.12});
//   kiln generate ... --cache fbcache:0.12           (a call's own cache: the request field `cache`)
//
// A transformer that takes a cache runs its repeated blocks through StepCache::run. Each of a call's
// transformer evaluations belongs to a context ("cond", or "uncond" for true classifier-free guidance's
// negative call), each with its own state, as diffusers' cache_context; the pipeline resets every context at
// the start of a call.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln {

// diffusers' FirstBlockCacheConfig (hooks/first_block_cache.py).
struct FirstBlockCacheConfig {
  double threshold = 0.05;
};

// diffusers' MagCacheConfig (hooks/mag_cache.py): from the step `retention_ratio` of the call's steps in, the
// blocks are skipped while the error accumulated from the magnitude ratios, sum |1 - prod ratio|, stays
// within `threshold`, for at most `max_skip_steps` steps in a row. `mag_ratios` are the checkpoint's, one per
// step (resampled to the call's steps as diffusers does); empty: the ratios published for the transformer
// (StepCache::published_mag_ratios: diffusers' FLUX_MAG_RATIOS, FLUX.1-dev's, for FLUX.1), refused where
// none are.
// `calibrate` skips nothing and measures the ratios instead (StepCache::calibrated_mag_ratios). diffusers'
// own num_inference_steps is the call's here.
struct MagCacheConfig {
  double threshold = 0.06;
  int max_skip_steps = 3;
  double retention_ratio = 0.2;
  std::vector<double> mag_ratios;
  bool calibrate = false;
};

// diffusers' TaylorSeerCacheConfig (hooks/taylorseer_cache.py), with its default identifiers: every attention
// of the blocks runs at the first `disable_cache_before_step` evaluations, then at one in `cache_interval`
// (and from `disable_cache_after_step` on, when set); in between its outputs are forecast from a Taylor
// series of order `max_order` in the evaluation index, whose factors (divided differences of its last
// computed outputs) are kept in `factors_dtype` (diffusers' default bfloat16). The rest of each block runs as
// usual.
struct TaylorSeerCacheConfig {
  int cache_interval = 5;
  int disable_cache_before_step = 3;
  std::optional<int> disable_cache_after_step;
  int max_order = 1;
  DType factors_dtype = bfloat16;
};

// The caches Kiln has, by diffusers' config classes.
using StepCacheConfig = std::variant<FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig>;

// "fbcache:0.12", "magcache:0.06[:max_skip=3][:retention=0.2][:ratios=1.0,1.21,...]", "magcache:calibrate"
// or "taylorseer[:interval=5][:warmup=3][:order=1][:until=N][:factors=f32]"
// (kiln generate --cache, the request field `cache`): the config; throws kiln::Error naming the forms it
// takes for anything else.
StepCacheConfig parse_step_cache(const std::string& spec);
// The form parse_step_cache reads back: "fbcache:0.12", "magcache:0.06:max_skip=3:retention=0.2".
std::string step_cache_spec(const StepCacheConfig& config);
// diffusers' FLUX_MAG_RATIOS: FLUX.1-dev's magnitude ratios at its 28 steps.
const std::vector<double>& flux_mag_ratios();

namespace nn {

// What the repeated blocks carry from one to the next: the image tokens, and the text tokens of dual-stream
// blocks (FLUX.1's double-stream blocks, SD3's joint blocks; undefined where the blocks carry one stream).
struct BlockStreams {
  Tensor image;
  Tensor text;
};

class StepCache {
 public:
  // One transformer evaluation's decision: its context, whether the blocks (after the first, for First Block
  // Cache) ran, and what decided it: First Block Cache's relative change, MagCache's accumulated error (-1
  // where nothing was measured: a context's first evaluation, MagCache's retained steps).
  struct Decision {
    std::string context;
    bool computed = true;
    double change = -1;
  };
  using RunBlocks = std::function<BlockStreams(size_t first, size_t last, const BlockStreams&)>;

  // The magnitude ratios published for this transformer's checkpoints (FLUX.1: diffusers' FLUX_MAG_RATIOS),
  // which a MagCache config without its own uses; empty where none are (such a config is refused).
  void set_published_mag_ratios(std::vector<double> ratios) { published_mag_ratios_ = std::move(ratios); }
  const std::vector<double>& published_mag_ratios() const { return published_mag_ratios_; }

  // diffusers' enable_cache / disable_cache: the cache every call uses unless its request names its own.
  void enable(const StepCacheConfig& config) { config_ = config; }
  void disable() { config_.reset(); }
  const std::optional<StepCacheConfig>& config() const { return config_; }

  // At the start of a pipeline call of `num_inference_steps` steps: every context's state forgotten, the
  // context "cond", and `call` the cache in effect until the next reset (the request's, else the enabled one;
  // nullopt: none).
  void reset(const std::optional<StepCacheConfig>& call, int num_inference_steps);
  // diffusers' cache_context: the state the following evaluations read and write.
  void set_context(const std::string& name) { context_ = name; }
  // The cache in effect for the current call.
  const std::optional<StepCacheConfig>& active() const { return active_; }
  // This call's decisions so far, one per transformer evaluation.
  const std::vector<Decision>& decisions() const { return decisions_; }
  // MagCache's calibration: the ratios this call measured ("cond"'s), once it has run all its steps.
  const std::vector<double>& calibrated_mag_ratios() const { return calibrated_; }

  // Whether the active cache forecasts modules inside the blocks (TaylorSeer): a compiled block cannot.
  bool forecasts_modules() const;
  // TaylorSeer: the outputs of the module `key` (an attention of the blocks) at this evaluation: compute()'s
  // when the schedule computes it (its Taylor factors updated), else their forecast. Without TaylorSeer,
  // compute()'s.
  std::vector<Tensor> module_outputs(const void* key, const std::function<std::vector<Tensor>()>& compute);

  // Runs `count` repeated blocks on `in`: run_blocks(first, last, streams) runs blocks [first, last) and
  // returns their output streams. Without a cache, all at once; with one, as its config says. Under tensor
  // parallelism every decision is rank 0's, broadcast, so that every rank takes the same path.
  BlockStreams run(size_t count, const BlockStreams& in, const RunBlocks& run_blocks);

 private:
  // One context's First Block Cache state (diffusers' FBCSharedBlockState).
  struct FirstBlockState {
    Tensor head_residual;          // the first block's residual at the last evaluation that ran the rest
    Tensor tail_image, tail_text;  // what the rest added to the first block's output then
  };
  // One context's MagCache state (diffusers' MagCacheState); the accumulators are float32, as diffusers'
  // products of its float32 ratios are.
  struct MagState {
    Tensor previous_residual;  // what the blocks added to their input at the last evaluation that ran them
    float accumulated_ratio = 1, accumulated_err = 0;
    int accumulated_steps = 0, step_index = 0;
    std::vector<double> calibration;
  };
  // One module's TaylorSeer state in one context (diffusers' TaylorSeerState).
  struct TaylorState {
    int current_step = -1;
    std::optional<int> last_update_step;
    std::vector<DType> dtypes;                 // of each output
    std::vector<std::vector<Tensor>> factors;  // per output, per order (in the config's factors dtype)
  };
  BlockStreams run_first_block(const FirstBlockCacheConfig& config, size_t count, const BlockStreams& in,
                               const RunBlocks& run_blocks);
  BlockStreams run_mag(const MagCacheConfig& config, size_t count, const BlockStreams& in,
                       const RunBlocks& run_blocks);
  // Rank 0's decision on every rank.
  static bool agreed(bool computed);

  std::optional<StepCacheConfig> config_;
  std::optional<StepCacheConfig> active_;
  std::vector<double> published_mag_ratios_;
  int num_inference_steps_ = 0;
  std::vector<float> mag_ratios_;  // the active MagCache's ratios at the call's steps
  std::string context_ = "cond";
  std::map<std::string, FirstBlockState> states_;
  std::map<std::string, MagState> mag_states_;
  std::map<std::pair<std::string, const void*>, TaylorState> taylor_states_;
  std::map<std::string, int> evaluations_;  // per context, for TaylorSeer's decisions
  std::vector<Decision> decisions_;
  std::vector<double> calibrated_;
};

}  // namespace nn
}  // namespace kiln
