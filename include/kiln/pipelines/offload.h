// Offloading as diffusers names it, on a host without an accelerator, where "on the device" means "in this
// process's memory" and the weights otherwise stay in their memory-mapped checkpoint files:
//  none        every component keeps its weights (packed copies included) between calls;
//  model       enable_model_cpu_offload: a component's weights are released once it has run;
//  sequential  enable_sequential_cpu_offload: no packed copies, and at most a budget of mapped weights stays
//  in
//              the process; the least recently read weight leaves first (kiln::set_resident_weight_budget).
// set_memory_budget picks the coarsest of these that keeps the weights under a number of bytes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/nn/module.h"

namespace kiln {

enum class OffloadMode { None, Model, Sequential };

struct OffloadPlan {
  OffloadMode mode = OffloadMode::None;
  int64_t budget = 0;        // bytes the weights may hold in the process
  int64_t weight_bytes = 0;  // all components
  std::string largest_component;
  int64_t largest_component_bytes = 0;
  std::string largest_tensor;  // "transformer: x_embedder.weight"
  int64_t largest_tensor_bytes = 0;
  std::string describe() const;
};

// The coarsest mode whose weights stay under `budget`: None when every component fits, Model when the largest
// component does, Sequential otherwise. Throws kiln::Error before any work when even the largest weight
// tensor does not fit, naming it and the size needed.
OffloadPlan plan_offload(const std::vector<std::pair<std::string, nn::Module*>>& components, int64_t budget);

}  // namespace kiln
