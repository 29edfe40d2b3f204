// Step caching: skipping transformer work between neighbouring denoising steps, as diffusers'
// `transformer.enable_cache(config)` does (diffusers/hooks/). Kiln has diffusers' First Block Cache
// (FirstBlockCacheConfig): the first repeated block always runs; the rest run only when the first block's
// residual (its output less its input) changed by more than `threshold` since the last step that ran them,
// relative to that step's (mean |r - r_prev| / mean |r_prev|); otherwise the residuals the rest added then
// are added to the first block's output. The same threshold gives diffusers' decisions, step by step, and its
// image.
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

// The caches Kiln has, by diffusers' config classes.
using StepCacheConfig = std::variant<FirstBlockCacheConfig>;

// "fbcache:0.12" (kiln generate --cache, the request field `cache`): the config; throws kiln::Error naming
// the forms it takes for anything else.
StepCacheConfig parse_step_cache(const std::string& spec);
// The form parse_step_cache reads back: "fbcache:0.12".
std::string step_cache_spec(const StepCacheConfig& config);

namespace nn {

// What the repeated blocks carry from one to the next: the image tokens, and the text tokens of dual-stream
// blocks (FLUX.1's double-stream blocks, SD3's joint blocks; undefined where the blocks carry one stream).
struct BlockStreams {
  Tensor image;
  Tensor text;
};

class StepCache {
 public:
  // One transformer evaluation's decision: its context, whether the blocks after the first ran, and the
  // change that decided it (-1 for a context's first evaluation, which always runs them).
  struct Decision {
    std::string context;
    bool computed = true;
    double change = -1;
  };

  // diffusers' enable_cache / disable_cache: the cache every call uses unless its request names its own.
  void enable(const StepCacheConfig& config) { config_ = config; }
  void disable() { config_.reset(); }
  const std::optional<StepCacheConfig>& config() const { return config_; }

  // At the start of a pipeline call: every context's state forgotten, the context "cond", and `call` the
  // cache in effect until the next reset (the request's, else the enabled one; nullopt: none).
  void reset(const std::optional<StepCacheConfig>& call);
  // diffusers' cache_context: the state the following evaluations read and write.
  void set_context(const std::string& name) { context_ = name; }
  // The cache in effect for the current call.
  const std::optional<StepCacheConfig>& active() const { return active_; }
  // This call's decisions so far, one per transformer evaluation.
  const std::vector<Decision>& decisions() const { return decisions_; }

  // Runs `count` repeated blocks on `in`: run_blocks(first, last, streams) runs blocks [first, last) and
  // returns their output streams. Without a cache, all at once; with First Block Cache, block 0, the
  // decision, then blocks [1, count) or the cached residuals. Under tensor parallelism the decision is rank
  // 0's, broadcast, so that every rank takes the same path.
  BlockStreams run(
      size_t count, const BlockStreams& in,
      const std::function<BlockStreams(size_t first, size_t last, const BlockStreams&)>& run_blocks);

 private:
  // One context's First Block Cache state (diffusers' FBCSharedBlockState).
  struct FirstBlockState {
    Tensor head_residual;          // the first block's residual at the last evaluation that ran the rest
    Tensor tail_image, tail_text;  // what the rest added to the first block's output then
  };
  std::optional<StepCacheConfig> config_;
  std::optional<StepCacheConfig> active_;
  std::string context_ = "cond";
  std::map<std::string, FirstBlockState> states_;
  std::vector<Decision> decisions_;
};

}  // namespace nn
}  // namespace kiln
