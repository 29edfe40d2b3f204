#include "kiln/nn/step_cache.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/dist/process_group.h"
#include "kiln/ops.h"

namespace kiln {

namespace {

constexpr const char* kForms = "fbcache:THRESHOLD (First Block Cache, e.g. fbcache:0.12), or none";

}  // namespace

StepCacheConfig parse_step_cache(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  KILN_CHECK(name == "fbcache" && colon != std::string::npos,
             "step cache '" << spec << "': expected " << kForms);
  const std::string value = spec.substr(colon + 1);
  char* end = nullptr;
  errno = 0;
  const double threshold = std::strtod(value.c_str(), &end);
  KILN_CHECK(!value.empty() && end == value.c_str() + value.size() && errno == 0 &&
                 std::isfinite(threshold) && threshold >= 0,
             "step cache '" << spec << "': the threshold must be a finite number >= 0 (" << kForms << ")");
  return FirstBlockCacheConfig{.threshold = threshold};
}

std::string step_cache_spec(const StepCacheConfig& config) {
  std::ostringstream out;
  out << "fbcache:" << std::get<FirstBlockCacheConfig>(config).threshold;
  return out.str();
}

namespace nn {

void StepCache::reset(const std::optional<StepCacheConfig>& call) {
  active_ = call;
  context_ = "cond";
  states_.clear();
  decisions_.clear();
}

BlockStreams StepCache::run(
    size_t count, const BlockStreams& in,
    const std::function<BlockStreams(size_t first, size_t last, const BlockStreams&)>& run_blocks) {
  const auto* first_block = active_ ? std::get_if<FirstBlockCacheConfig>(&*active_) : nullptr;
  if (first_block == nullptr || count < 2) return run_blocks(0, count, in);

  const BlockStreams head = run_blocks(0, 1, in);
  const Tensor residual = sub(head.image, in.image);
  FirstBlockState& state = states_[context_];
  Decision decision{context_, true, -1};
  if (state.head_residual.defined()) {
    // diffusers: (residual - previous).abs().mean() / previous.abs().mean(), in the model's dtype, read as a
    // Python float and compared with the threshold.
    const Tensor change = div(mean(abs(sub(residual, state.head_residual))), mean(abs(state.head_residual)));
    decision.change = change.item();
    decision.computed = decision.change > first_block->threshold;
  }
  if (dist::world_size() > 1) {
    // Rank 0's decision on every rank: the ranks' activations agree, but a decision must not hang on their
    // last bit.
    uint8_t computed = decision.computed ? 1 : 0;
    dist::broadcast_from_rank0(&computed, sizeof computed);
    decision.computed = computed != 0;
  }
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

}  // namespace nn
}  // namespace kiln
