// Step caching: skipping transformer work between neighbouring denoising steps, as diffusers'
// `transformer.enable_cache(config)` does (diffusers/hooks/). Kiln has five of diffusers' caches:
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
//   TaylorSeer, Pyramid Attention Broadcast and FasterCache work inside the blocks, per attention: see their
//   configs below.
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
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
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

// diffusers' PyramidAttentionBroadcastConfig (hooks/pyramid_attention_broadcast.py), its spatial part with
// its default identifiers: every attention of the blocks (FLUX.1's transformer_blocks.N.attn and
// single_transformer_blocks.N.attn, Qwen-Image's transformer_blocks.N.attn) runs at its first evaluation, at
// every evaluation whose timestep (the scheduler's t, sigma * 1000 for flow matching) is not strictly inside
// `spatial_attention_timestep_skip_range`, and at one evaluation in `spatial_attention_block_skip_range`
// (counted from its first); at the others it gives its last output again. The cross-attention and temporal
// parts have nothing to act on here: these attentions are joint self-attentions over the text and image
// tokens, and the models have no temporal attention. diffusers' default skip range is None, which it replaces
// with 2 (warning); Kiln's default is that 2.
struct PyramidAttentionBroadcastConfig {
  int spatial_attention_block_skip_range = 2;
  std::pair<double, double> spatial_attention_timestep_skip_range{100, 800};
};

// diffusers' FasterCacheConfig (hooks/faster_cache.py) with is_guidance_distilled=True, its default
// identifiers (the same attentions as PAB's): outside `spatial_attention_timestep_skip_range` (strictly) an
// attention runs; inside it runs only at evaluations whose index (from 0) is a positive multiple of
// `spatial_attention_block_skip_range`, and at the others its outputs are extrapolated from its last two,
// t + (t - t_2) * `attention_weight` (diffusers' attention_weight_callback, a constant here: its default
// 0.5). is_guidance_distilled=false is refused: its other half (the unconditional branch approximated from
// the conditional one in frequency space) needs a batch-concatenated CFG call and an image-shaped (B, C, H,
// W) transformer output, which neither FLUX.1's nor Qwen-Image's transformer has (they call the branches
// separately, on packed tokens).
struct FasterCacheConfig {
  int spatial_attention_block_skip_range = 2;
  std::pair<double, double> spatial_attention_timestep_skip_range{-1, 681};
  double attention_weight = 0.5;
  bool is_guidance_distilled = true;
};

// The caches Kiln has, by diffusers' config classes.
using StepCacheConfig = std::variant<FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig,
                                     PyramidAttentionBroadcastConfig, FasterCacheConfig>;

// "fbcache:0.12", "magcache:0.06[:max_skip=3][:retention=0.2][:ratios=1.0,1.21,...]", "magcache:calibrate",
// "taylorseer[:interval=5][:warmup=3][:order=1][:until=N][:factors=f32]", "pab[:skip=2][:range=100,800]" or
// "fastercache[:skip=2][:range=-1,681][:weight=0.5]"
// (kiln generate --cache, the request field `cache`): the config; throws kiln::Error naming the forms it
// takes for anything else.
StepCacheConfig parse_step_cache(const std::string& spec);
// The form parse_step_cache reads back: "fbcache:0.12", "magcache:0.06:max_skip=3:retention=0.2".
std::string step_cache_spec(const StepCacheConfig& config);
// Throws kiln::Error naming what a config asks that Kiln cannot do (a skip range below 1, a timestep range
// whose ends are not in order, FasterCache with is_guidance_distilled=false, ...); enable_cache and every
// call check it.
void check_step_cache(const StepCacheConfig& config);
// The name of a cache that works per attention inside the blocks (TaylorSeer, Pyramid Attention Broadcast,
// FasterCache), which a compiled block program cannot; nullptr for the others.
const char* attention_step_cache_name(const StepCacheConfig& config);
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
  // The attention caches (TaylorSeer, PAB, FasterCache) decide per attention: `computed` is the first
  // attention's, and the counts say how many of the evaluation's attentions ran and how many were reused
  // (forecast, broadcast or extrapolated).
  struct Decision {
    std::string context;
    bool computed = true;
    double change = -1;
    int attentions_computed = 0, attentions_reused = 0;
  };
  using RunBlocks = std::function<BlockStreams(size_t first, size_t last, const BlockStreams&)>;

  // The magnitude ratios published for this transformer's checkpoints (FLUX.1: diffusers' FLUX_MAG_RATIOS),
  // which a MagCache config without its own uses; empty where none are (such a config is refused).
  void set_published_mag_ratios(std::vector<double> ratios) { published_mag_ratios_ = std::move(ratios); }
  const std::vector<double>& published_mag_ratios() const { return published_mag_ratios_; }
  // Why this transformer does not take `config` (empty: it does): a cache diffusers has no working reference
  // for on it (FLUX.2's First Block Cache, Chroma's block caches). The pipeline's request check refuses such
  // a cache by name, and run() too where a call has one in effect outside that check.
  using Refusal = std::function<std::string(const StepCacheConfig&)>;
  void set_refusal(Refusal refusal) { refusal_ = std::move(refusal); }
  std::string refusal(const StepCacheConfig& config) const { return refusal_ ? refusal_(config) : ""; }

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
  // The timestep of the evaluations that follow (diffusers' pipe.current_timestep: the scheduler's t), which
  // Pyramid Attention Broadcast and FasterCache compare with their ranges; the denoising loop sets it before
  // each step. Unset (NaN, e.g. a transformer called outside a pipeline), no range contains it.
  void set_timestep(float timestep) { timestep_ = timestep; }
  // The cache in effect for the current call.
  const std::optional<StepCacheConfig>& active() const { return active_; }
  // This call's decisions so far, one per transformer evaluation.
  const std::vector<Decision>& decisions() const { return decisions_; }
  // MagCache's calibration: the ratios this call measured ("cond"'s), once it has run all its steps.
  const std::vector<double>& calibrated_mag_ratios() const { return calibrated_; }

  // Whether the active cache decides per module inside the blocks (TaylorSeer, Pyramid Attention Broadcast,
  // FasterCache): a compiled block cannot.
  bool forecasts_modules() const;
  // The outputs of the module `key` (an attention of the blocks) at this evaluation: compute()'s when the
  // active cache's schedule computes it, else TaylorSeer's forecast from its Taylor factors, PAB's last
  // outputs, or FasterCache's extrapolation from its last two. Without such a cache, compute()'s.
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
  // One module's Pyramid Attention Broadcast or FasterCache state (diffusers' PyramidAttentionBroadcastState,
  // FasterCacheBlockState): one per module whatever the context, as diffusers' hooks keep it.
  struct AttentionState {
    int iteration = 0;
    std::vector<Tensor> latest;    // its outputs at the last evaluation (computed or not)
    std::vector<Tensor> previous;  // FasterCache: those of the evaluation before (t_2)
  };
  std::vector<Tensor> broadcast_outputs(const PyramidAttentionBroadcastConfig& config, AttentionState& state,
                                        const std::function<std::vector<Tensor>()>& compute);
  std::vector<Tensor> faster_outputs(const FasterCacheConfig& config, AttentionState& state,
                                     const std::function<std::vector<Tensor>()>& compute);
  std::vector<Tensor> taylor_outputs(const TaylorSeerCacheConfig& config, const void* key,
                                     const std::function<std::vector<Tensor>()>& compute);
  // Counts a module's decision in the evaluation's Decision (the first module's is its `computed`).
  void count_attention(bool computed);
  // Rank 0's decision on every rank.
  static bool agreed(bool computed);

  std::optional<StepCacheConfig> config_;
  std::optional<StepCacheConfig> active_;
  std::vector<double> published_mag_ratios_;
  Refusal refusal_;
  int num_inference_steps_ = 0;
  std::vector<float> mag_ratios_;  // the active MagCache's ratios at the call's steps
  std::string context_ = "cond";
  std::map<std::string, FirstBlockState> states_;
  std::map<std::string, MagState> mag_states_;
  std::map<std::pair<std::string, const void*>, TaylorState> taylor_states_;
  std::map<const void*, AttentionState> attention_states_;
  float timestep_ = std::numeric_limits<float>::quiet_NaN();
  bool in_evaluation_ = false;              // run() is running the blocks of the last Decision
  std::map<std::string, int> evaluations_;  // per context, for TaylorSeer's decisions
  std::vector<Decision> decisions_;
  std::vector<double> calibrated_;
};

}  // namespace nn
}  // namespace kiln
