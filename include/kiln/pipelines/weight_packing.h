// Which of a pipeline's weights get packed copies for the matmuls (see kiln::set_packed_weight_budget).
//
// A packed copy is anonymous memory: it is ~10% faster to multiply by than the weight as stored, and once it
// exists the weight's file pages are handed back, so a model that fits is resident once. A model that does
// not fit must stay in the memory-mapped checkpoint, where the OS keeps what it can in the page cache and
// reads the rest again from disk; packing it would pin it in memory and run the machine out (issue #18: a
// 32 GB FLUX.1-schnell on a 24 GiB machine). So by default a pipeline packs all of its weights when they fit
// in half of the machine's memory and none of them otherwise, which is how diffusers holds any model.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace kiln {

// A packed-weight budget meaning "no limit".
inline constexpr int64_t kAllWeightsPacked = std::numeric_limits<int64_t>::max();

struct WeightPackingPlan {
  int64_t weight_bytes = 0;       // the pipeline's weights in their compute dtype
  int64_t memory_bytes = 0;       // this machine's memory (physical, or the cgroup's limit if lower)
  std::optional<int64_t> budget;  // what set_packed_weight_budget receives; std::nullopt: no limit
  bool requested = false;         // the budget was asked for, not chosen by the default rule
  std::string describe() const;   // one line for logs and `kiln info`
};

// This machine's memory: physical memory, or the cgroup (v2 or v1) limit of this process when lower.
int64_t machine_memory_bytes();

// The plan for a pipeline whose weights take `weight_bytes`: the `requested` budget when given
// (kAllWeightsPacked: no limit), else all packed when weight_bytes <= memory_bytes / 2 and none otherwise.
WeightPackingPlan plan_weight_packing(int64_t weight_bytes, std::optional<int64_t> requested,
                                      int64_t memory_bytes = machine_memory_bytes());

// Plans for `weight_bytes` (as plan_weight_packing), sets the process-wide packed-weight budget from the plan
// and says so under KILN_LOG=memory.
WeightPackingPlan apply_weight_packing(int64_t weight_bytes, std::optional<int64_t> requested);

// Parses a byte size as the command line takes it: "12GiB", "512MiB", "8GB", "1.5GiB", "1000000", "all"
// (kAllWeightsPacked) or "none" (0). Throws kiln::Error naming `flag` and the accepted forms.
int64_t parse_byte_budget(const std::string& text, const std::string& flag);

}  // namespace kiln
