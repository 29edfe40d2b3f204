// Group offloading's mechanism (diffusers' enable_group_offload), per execution context (its MemoryPolicy,
// kiln/runtime/memory_policy.h): weights are registered in groups (a few consecutive transformer blocks
// each), and the runtime reports each tensor a kernel reads when it launches the kernel. When a kernel first
// reads a weight of another group, that group becomes the current one: the group that ran
// before is sent out, and the group expected next is brought in on a background thread while the current
// one computes. The expected next group is the one that followed last time, or the next registered group
// of the same component (wrapping to its first: a denoising loop runs the blocks again).
//
// Because the trigger is a kernel reading a weight, it works the same in every execution mode (eager,
// deferred-and-fused, compiled: compiled programs take the weights as inputs), and nothing recompiles.
//
// Weights move through their device's WeightTier (kiln/core/weight_tier.h): on a host without an
// accelerator "in" means a weight's file pages are mapped in this process (read from the file, or from the
// page cache, by the prefetch thread) and "out" means they are handed back to the OS, the page cache keeping
// them while memory allows; a device backend's tier makes "in" a copy to device memory on its transfer
// stream and "out" the freeing of that copy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln {

struct WeightGroup {
  std::string component;  // "transformer"
  std::string name;       // "transformer_blocks.4-7"
  std::vector<Tensor> weights;
};

// On the calling thread's current context (kiln/runtime/execution_context.h):
// Replaces the registered groups (none: group offloading off). `prefetch`: bring the expected next group in
// while the current one runs (diffusers' use_stream=True); without it, a group's pages are read when its
// kernels touch them.
void set_weight_groups(std::vector<WeightGroup> groups, bool prefetch);
void clear_weight_groups();
// Stops any prefetch in flight and forgets which group is current; the weights stay registered. For a
// pipeline about to release a component's weights: nothing brings them back behind its back.
void stop_weight_prefetch();

struct WeightGroupStats {
  int64_t groups = 0;            // registered
  int64_t switches = 0;          // times a kernel read a weight of a group other than the current one
  int64_t prefetches = 0;        // groups brought in ahead of use
  int64_t prefetched_bytes = 0;  // bytes those prefetches mapped
  int64_t prefetch_hits = 0;     // switches to the group that had been brought in
  int64_t released = 0;          // groups sent out
};
WeightGroupStats weight_group_stats();

}  // namespace kiln
