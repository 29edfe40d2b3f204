#include "pipelines/model_offload.h"

#include <chrono>
#include <cstdio>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/log.h"
#include "kiln/ops/linalg.h"
#include "kiln/pipelines/offload.h"

namespace kiln::pipelines {

void release_after_use(std::initializer_list<std::pair<const char*, nn::Module*>> components) {
  for (const auto& [name, module] : components) {
    if (module == nullptr) continue;
    const auto start = std::chrono::steady_clock::now();
    const size_t bytes = module->release_weights();
    if (log_enabled("offload")) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      char line[160];
      std::snprintf(line, sizeof line, "%s: released %.2f GB of weights after use (%.0f ms)", name,
                    bytes / 1e9, ms);
      log("offload", line);
    }
  }
}

bool apply_offload(const OffloadPlan& plan) {
  if (log_enabled("offload")) log("offload", plan.describe());
  switch (plan.mode) {
    case OffloadMode::None:
      set_resident_weight_budget(std::nullopt);
      return false;
    case OffloadMode::Model:
      set_packed_weight_budget(plan.budget);
      set_resident_weight_budget(std::nullopt);
      return true;
    case OffloadMode::Sequential:
      set_packed_weight_budget(0);
      set_resident_weight_budget(plan.budget);
      return true;
  }
  return false;
}

}  // namespace kiln::pipelines

namespace kiln {

namespace {

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

OffloadPlan plan_offload(const std::vector<std::pair<std::string, nn::Module*>>& components, int64_t budget) {
  OffloadPlan plan;
  plan.budget = budget;
  for (const auto& [name, module] : components) {
    if (module == nullptr) continue;
    int64_t bytes = 0;
    for (const auto& [tensor, slot] : module->named_parameters()) {
      if (!slot->defined()) continue;
      const auto n = static_cast<int64_t>(slot->nbytes());
      bytes += n;
      if (n > plan.largest_tensor_bytes) {
        plan.largest_tensor_bytes = n;
        plan.largest_tensor = name + ": " + tensor;
      }
    }
    plan.weight_bytes += bytes;
    if (bytes > plan.largest_component_bytes) {
      plan.largest_component_bytes = bytes;
      plan.largest_component = name;
    }
  }
  KILN_CHECK(
      budget >= plan.largest_tensor_bytes,
      "memory budget " << gib(budget) << " is below the largest weight, " << plan.largest_tensor << " ("
                       << gib(plan.largest_tensor_bytes) << "), which must be in memory while it is used; "
                       << "expected at least " << gib(plan.largest_tensor_bytes) << " plus activations");
  plan.mode = plan.weight_bytes <= budget              ? OffloadMode::None
              : plan.largest_component_bytes <= budget ? OffloadMode::Model
                                                       : OffloadMode::Sequential;
  return plan;
}

std::string OffloadPlan::describe() const {
  std::ostringstream s;
  s << "memory budget " << gib(budget) << " for " << gib(weight_bytes) << " of weights (plus activations): ";
  switch (mode) {
    case OffloadMode::None:
      s << "every component stays in memory (no offload)";
      break;
    case OffloadMode::Model:
      s << "model offload, one component at a time (the largest, " << largest_component << ", "
        << gib(largest_component_bytes) << ")";
      break;
    case OffloadMode::Sequential:
      s << "sequential offload: at most " << gib(budget)
        << " of mapped weights in memory, read in place, the "
        << "least recently used released first (largest component " << largest_component << ", "
        << gib(largest_component_bytes) << ")";
      break;
  }
  return s.str();
}

}  // namespace kiln
