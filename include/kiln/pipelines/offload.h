// Offloading as diffusers names it. On a host without an accelerator "on the device" means "in this
// process's memory" and the weights otherwise stay in their memory-mapped checkpoint files. Onto a device
// with memory of its own (a PJRT device: xla-cpu, cuda, tpu) the weights stay on the host the same way and
// "on the device" means copied into its memory (kiln/core/weight_tier.h); model and group offload work
// there, sequential is the cpu's only:
//  none        every component keeps its weights (packed copies included) between calls;
//  model       enable_model_cpu_offload: a component's weights are released once it has run;
//  group       enable_group_offload: weights read in place, a component's repeated blocks in groups of
//              blocks_per_group; a group's pages are sent out once the next group runs, and the group
//              after it is brought in while the current one computes (kiln/runtime/weight_groups.h);
//  sequential  enable_sequential_cpu_offload: no packed copies, and at most a budget of mapped weights stays
//              in the process; the least recently read weight leaves first
//              (kiln::set_resident_weight_budget).
// set_memory_budget picks the coarsest of these that keeps the weights under a number of bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/nn/block_positions.h"
#include "kiln/nn/module.h"

namespace kiln {

enum class OffloadMode { None, Model, Group, Sequential };

// The device components compute on when an offload call names none (diffusers detects the accelerator): the
// first accelerator this build has a backend for, else the CPU. This build has the CPU backend only.
Device default_compute_device();
const char* offload_mode_name(OffloadMode mode);

// diffusers' enable_group_offload(num_blocks_per_group=..., use_stream=...), with block-level groups.
struct GroupOffloadOptions {
  int blocks_per_group = 1;
  bool prefetch = true;  // bring the next group in while the current one runs (diffusers' use_stream)
  // diffusers' onload_device: where the groups are brought in and the components compute; absent: where the
  // pipeline's transformer is (the cpu unless pipe.to moved it).
  std::optional<Device> onload_device;
};

// One weight of a component: its bytes in memory and the repeated block it belongs to, which the planner
// groups blocks by (nn::Module::repeated_blocks; outside every block unless set).
struct ComponentWeight {
  std::string name;
  int64_t bytes = 0;
  nn::BlockPosition block;
};

// A component's weights, in the order they are registered (which is the order the blocks run).
struct ComponentWeights {
  std::string name;
  std::vector<ComponentWeight> tensors;
};
// The loaded weights of each module (undefined slots left out), each with its block.
std::vector<ComponentWeights> component_weights(
    const std::vector<std::pair<std::string, nn::Module*>>& components);

// What one component holds while it runs, under a plan.
struct ComponentResidency {
  std::string name;
  int64_t bytes = 0;           // all its weights
  int64_t outside_blocks = 0;  // weights outside repeated blocks (embeddings, final norms)
  int64_t blocks = 0;          // repeated blocks
  int64_t largest_group = 0;   // bytes of its largest group of blocks_per_group consecutive blocks
  int64_t peak = 0;            // the most it holds at once under the plan's mode
  int64_t group_minimum = 0;   // the most it holds under group offload with one block per group, prefetching
};

struct OffloadPlan {
  OffloadMode mode = OffloadMode::None;
  int64_t budget = 0;        // bytes the weights may hold in the process
  int64_t weight_bytes = 0;  // all components
  std::string largest_component;
  int64_t largest_component_bytes = 0;
  std::string largest_tensor;  // "transformer: x_embedder.weight"
  int64_t largest_tensor_bytes = 0;
  GroupOffloadOptions group;                   // for OffloadMode::Group: the largest groups that fit
  std::vector<ComponentResidency> components;  // in the order given (the order they run)
  int64_t peak_weight_bytes = 0;               // the most the weights hold at once (activations come on top)
  int64_t activations = 0;  // a budget on a device: the bytes kept for the activations (weights get the rest)
  // One line: the mode and why.
  std::string describe() const;
  // Several lines: what each component holds while it runs, and the expected peak (kiln info --max-memory).
  std::string describe_residency() const;
};

// The coarsest mode whose weights stay under `budget`: None when every component fits, Model when the largest
// component does, Group with the most blocks per group that fit (a component's weights outside its blocks,
// plus the running group and the one being brought in; a group holds consecutive blocks of one list, blocks
// in the order their weights first come), Sequential otherwise. Throws kiln::Error before any
// work when even the largest weight tensor does not fit, naming it and the size needed.
OffloadPlan plan_offload(const std::vector<ComponentWeights>& components, int64_t budget);
OffloadPlan plan_offload(const std::vector<std::pair<std::string, nn::Module*>>& components, int64_t budget);

}  // namespace kiln
