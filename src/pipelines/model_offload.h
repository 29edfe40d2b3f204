// diffusers' enable_model_cpu_offload, as a host without an accelerator does it: once a component has run,
// its weights are released (Module::release_weights: packed copies freed, checkpoint file pages handed back,
// page cache included), so the memory goes to the component that runs next; the next call reads them again
// from the file.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/nn/module.h"
#include "kiln/pipelines/offload.h"
#include "kiln/pipelines/weight_packing.h"
#include "kiln/runtime/weight_groups.h"

namespace kiln::pipelines {

// Releases each (name, module) that ran; says what was released under KILN_LOG=offload.
void release_after_use(std::initializer_list<std::pair<const char*, nn::Module*>> components);

using NamedComponents = std::vector<std::pair<std::string, nn::Module*>>;

// The device an offload call computes on: `requested`, checked to have a backend in this build (the cpu, or a
// device offloaded onto: Module::offload_to), else default_compute_device().
Device offload_compute_device(std::optional<Device> requested);

// Turns group and sequential offloading off and packs weights as `packing` (the plan made when loading
// ended) says: what pipe.to(device) and enable_model_cpu_offload start from.
void clear_offload(const WeightPackingPlan& packing);

// Sets the process-wide budgets a plan needs (packed copies, resident mapped weights) and, for group
// offload, registers the components' groups of blocks; returns whether the pipeline must also release each
// component after use.
bool apply_offload(const OffloadPlan& plan, const NamedComponents& components);

// plan_offload for a device with memory of its own: none, model or group offload onto `device`; a budget
// below group offload's one-block groups is refused naming the component and the bytes it needs (sequential
// offload is the cpu's only).
OffloadPlan plan_device_offload(const NamedComponents& components, int64_t budget, Device device);

// The components' repeated blocks (nn::Module::repeated_blocks) in groups of `blocks_per_group` consecutive
// blocks of one list, in the order they run (kiln/runtime/weight_groups.h). Weights outside blocks are in no
// group: they stay while their component runs.
std::vector<WeightGroup> block_groups(const NamedComponents& components, int blocks_per_group);

}  // namespace kiln::pipelines
