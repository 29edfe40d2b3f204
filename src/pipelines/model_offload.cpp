#include "pipelines/model_offload.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>

#include "kiln/core/bytes.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"
#include "kiln/core/log.h"
#include "kiln/ops/linalg.h"
#include "kiln/pipelines/offload.h"
#include "kiln/runtime/execution_context.h"

namespace kiln::pipelines {

void release_after_use(std::initializer_list<std::pair<const char*, nn::Module*>> components) {
  for (const auto& [name, module] : components) {
    if (module == nullptr) continue;
    synchronize(module->device());  // the component's queued work first: the time logged is the release's own
    const auto start = std::chrono::steady_clock::now();
    const size_t bytes = module->release_weights();
    if (log_enabled("offload")) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      char line[160];
      std::snprintf(line, sizeof line, "%s: released %s of weights after use (%.0f ms)", name,
                    format_bytes(static_cast<int64_t>(bytes)).c_str(), ms);
      log("offload", line);
    }
  }
}

Device offload_compute_device(std::optional<Device> requested) {
  if (!requested) return default_compute_device();
  device_runtime(*requested);  // throws, naming the device, when this build has no backend for it
  return *requested;
}

void clear_offload(const WeightPackingPlan& packing) {
  clear_weight_groups();
  set_resident_weight_budget(std::nullopt);
  set_packed_weight_budget(packing.budget);
}

bool apply_offload(const OffloadPlan& plan, const NamedComponents& components) {
  if (log_enabled("offload")) log("offload", plan.describe());
  clear_weight_groups();
  // A pipeline that already ran holds packed copies and mapped pages the new budget does not allow: the
  // offloaded state starts from nothing held (the budgets below only govern what is brought in later).
  if (plan.mode != OffloadMode::None)
    for (const auto& [name, module] : components)
      if (module != nullptr) module->release_weights();
  switch (plan.mode) {
    case OffloadMode::None:
      set_resident_weight_budget(std::nullopt);
      return false;
    case OffloadMode::Model:
      set_packed_weight_budget(plan.budget);
      set_resident_weight_budget(std::nullopt);
      return true;
    case OffloadMode::Group:
      // Read in place: a packed copy would outlive its group (and packing every group every step costs
      // more than the 2-6% that reading in place does).
      set_packed_weight_budget(0);
      set_resident_weight_budget(std::nullopt);
      set_weight_groups(block_groups(components, plan.group.blocks_per_group), plan.group.prefetch);
      return true;
    case OffloadMode::Sequential:
      set_packed_weight_budget(0);
      set_resident_weight_budget(plan.budget);
      return true;
  }
  return false;
}

OffloadPlan plan_device_offload(const NamedComponents& components, int64_t budget, Device device) {
  OffloadPlan plan = plan_offload(components, budget);
  if (plan.mode != OffloadMode::Sequential) return plan;
  const ComponentResidency* most = &plan.components.front();
  for (const ComponentResidency& r : plan.components)
    if (r.group_minimum > most->group_minimum) most = &r;
  std::ostringstream holds;
  if (most->blocks == 0)
    holds << format_bytes(most->bytes) << " of weights in no repeated block, all read while it runs";
  else
    holds << format_bytes(most->outside_blocks) << " of weights outside its " << most->blocks
          << " blocks plus two groups of one block (the largest " << format_bytes(most->largest_group)
          << "), " << format_bytes(most->group_minimum) << " at once";
  KILN_FAIL(
      "memory budget " << format_bytes(budget) << " on " << device.str()
                       << " is below what group offload needs there: " << most->name << " holds "
                       << holds.str() << "; expected at least " << format_bytes(most->group_minimum)
                       << " plus activations (sequential offload, one weight at a time, runs on the cpu "
                          "only)");
}

std::vector<WeightGroup> block_groups(const NamedComponents& components, int blocks_per_group) {
  KILN_CHECK(blocks_per_group >= 1,
             "group offload: blocks_per_group must be at least 1, got " << blocks_per_group);
  const auto per_group = static_cast<size_t>(blocks_per_group);
  std::vector<WeightGroup> groups;
  for (const auto& [component, module] : components) {
    if (module == nullptr) continue;
    for (const nn::BlockList& list : module->repeated_blocks()) {
      for (size_t first = 0; first < list.blocks.size(); first += per_group) {
        const size_t last = std::min(first + per_group, list.blocks.size()) - 1;
        WeightGroup group{component, list.name + "." + std::to_string(first), {}};
        if (last > first) group.name += "-" + std::to_string(last);
        for (size_t i = first; i <= last; ++i)
          for (const auto& [name, slot] : list.blocks[i]->named_parameters()) group.weights.push_back(*slot);
        groups.push_back(std::move(group));
      }
    }
  }
  return groups;
}

}  // namespace kiln::pipelines

namespace kiln {

namespace {

// A component's repeated blocks in order, as (block list, bytes) per block, and the bytes outside them.
struct BlockLayout {
  std::vector<std::pair<std::string, int64_t>> blocks;  // (list the block belongs to, bytes)
  int64_t outside = 0;
};

BlockLayout block_layout(const ComponentWeights& component) {
  BlockLayout layout;
  std::map<std::pair<std::string, int64_t>, size_t> index;  // (list, block) -> position in layout.blocks
  for (const ComponentWeight& w : component.tensors) {
    if (!w.block.in_block()) {
      layout.outside += w.bytes;
      continue;
    }
    auto [it, added] = index.emplace(std::pair{w.block.list, w.block.block}, layout.blocks.size());
    if (added) layout.blocks.emplace_back(w.block.list, 0);
    layout.blocks[it->second].second += w.bytes;
  }
  return layout;
}

// The groups of `per_group` consecutive blocks of one list (a group never spans two lists), as bytes.
std::vector<int64_t> group_bytes(const BlockLayout& layout, int per_group) {
  std::vector<int64_t> groups;
  int in_group = 0;
  std::string list;
  for (const auto& [block_list, bytes] : layout.blocks) {
    if (groups.empty() || in_group == per_group || block_list != list) {
      groups.push_back(0);
      in_group = 0;
      list = block_list;
    }
    groups.back() += bytes;
    ++in_group;
  }
  return groups;
}

// The most a component holds at once under group offload: its weights outside blocks, the running group and,
// with prefetch, the group brought in behind it (the pairs wrap: a denoising loop runs the blocks again).
int64_t group_peak(const BlockLayout& layout, int per_group, bool prefetch, int64_t* largest_group) {
  const std::vector<int64_t> groups = group_bytes(layout, per_group);
  int64_t most = 0, largest = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    largest = std::max(largest, groups[i]);
    const int64_t next = prefetch && groups.size() > 1 ? groups[(i + 1) % groups.size()] : 0;
    most = std::max(most, groups[i] + next);
  }
  if (largest_group != nullptr) *largest_group = largest;
  return layout.outside + most;
}

}  // namespace

Device default_compute_device() {
  // The accelerators come first once a backend for one is built in; today only the CPU has one.
  return cpu;
}

const char* offload_mode_name(OffloadMode mode) {
  switch (mode) {
    case OffloadMode::None:
      return "none";
    case OffloadMode::Model:
      return "model";
    case OffloadMode::Group:
      return "group";
    case OffloadMode::Sequential:
      return "sequential";
  }
  return "?";
}

std::vector<ComponentWeights> component_weights(
    const std::vector<std::pair<std::string, nn::Module*>>& components) {
  std::vector<ComponentWeights> out;
  for (const auto& [name, module] : components) {
    if (module == nullptr) continue;
    ComponentWeights c{name, {}};
    const std::vector<nn::BlockPosition> blocks = nn::parameter_block_positions(*module);
    size_t i = 0;
    for (const auto& [tensor, slot] : module->named_parameters()) {
      const nn::BlockPosition& block = blocks[i++];
      if (slot->defined()) c.tensors.push_back({tensor, static_cast<int64_t>(slot->nbytes()), block});
    }
    out.push_back(std::move(c));
  }
  return out;
}

OffloadPlan plan_offload(const std::vector<std::pair<std::string, nn::Module*>>& components, int64_t budget) {
  return plan_offload(component_weights(components), budget);
}

OffloadPlan plan_offload(const std::vector<ComponentWeights>& components, int64_t budget) {
  OffloadPlan plan;
  plan.budget = budget;
  std::vector<BlockLayout> layouts;
  int most_blocks = 0;
  for (const ComponentWeights& c : components) {
    ComponentResidency r{c.name};
    for (const ComponentWeight& w : c.tensors) {
      r.bytes += w.bytes;
      if (w.bytes > plan.largest_tensor_bytes) {
        plan.largest_tensor_bytes = w.bytes;
        plan.largest_tensor = c.name + ": " + w.name;
      }
    }
    layouts.push_back(block_layout(c));
    r.outside_blocks = layouts.back().outside;
    r.blocks = static_cast<int64_t>(layouts.back().blocks.size());
    most_blocks = std::max(most_blocks, static_cast<int>(r.blocks));
    plan.weight_bytes += r.bytes;
    if (r.bytes > plan.largest_component_bytes) {
      plan.largest_component_bytes = r.bytes;
      plan.largest_component = c.name;
    }
    plan.components.push_back(r);
  }
  KILN_CHECK(budget >= plan.largest_tensor_bytes,
             "memory budget " << format_bytes(budget) << " is below the largest weight, "
                              << plan.largest_tensor << " (" << format_bytes(plan.largest_tensor_bytes)
                              << "), which must be in memory while it is used; "
                              << "expected at least " << format_bytes(plan.largest_tensor_bytes)
                              << " plus activations");
  // The most blocks per group whose every component fits; 0 when even single blocks do not.
  const auto group_fits = [&](int per_group) {
    for (const BlockLayout& layout : layouts)
      if (group_peak(layout, per_group, true, nullptr) > budget) return false;
    return true;
  };
  int per_group = 0;
  for (int k = std::max(most_blocks, 1); k >= 1 && per_group == 0; --k)
    if (group_fits(k)) per_group = k;
  plan.mode = plan.weight_bytes <= budget              ? OffloadMode::None
              : plan.largest_component_bytes <= budget ? OffloadMode::Model
              : per_group > 0                          ? OffloadMode::Group
                                                       : OffloadMode::Sequential;
  if (plan.mode == OffloadMode::Group) plan.group = {.blocks_per_group = per_group, .prefetch = true};
  for (size_t i = 0; i < plan.components.size(); ++i) {
    ComponentResidency& r = plan.components[i];
    group_peak(layouts[i], std::max(plan.group.blocks_per_group, 1), plan.group.prefetch, &r.largest_group);
    r.group_minimum = std::min(r.bytes, group_peak(layouts[i], 1, true, nullptr));
    switch (plan.mode) {
      case OffloadMode::None:
        r.peak = plan.weight_bytes;  // every component stays
        break;
      case OffloadMode::Model:
        r.peak = r.bytes;
        break;
      case OffloadMode::Group:
        r.peak = std::min(r.bytes, group_peak(layouts[i], plan.group.blocks_per_group, true, nullptr));
        break;
      case OffloadMode::Sequential:
        r.peak = std::min(r.bytes, budget);
        break;
    }
    plan.peak_weight_bytes = std::max(plan.peak_weight_bytes, r.peak);
  }
  return plan;
}

std::string OffloadPlan::describe() const {
  std::ostringstream s;
  if (activations > 0)
    s << "memory budget " << format_bytes(budget + activations) << ", " << format_bytes(activations)
      << " of it kept for activations, " << format_bytes(budget) << " for " << format_bytes(weight_bytes)
      << " of weights: ";
  else
    s << "memory budget " << format_bytes(budget) << " for " << format_bytes(weight_bytes)
      << " of weights (plus activations): ";
  switch (mode) {
    case OffloadMode::None:
      s << "every component stays in memory (no offload)";
      break;
    case OffloadMode::Model:
      s << "model offload, one component at a time (the largest, " << largest_component << ", "
        << format_bytes(largest_component_bytes) << ")";
      break;
    case OffloadMode::Group:
      s << "group offload, " << group.blocks_per_group << " block" << (group.blocks_per_group > 1 ? "s" : "")
        << " per group, the next group brought in while one runs (at most " << format_bytes(peak_weight_bytes)
        << " of weights at once)";
      break;
    case OffloadMode::Sequential:
      s << "sequential offload: at most " << format_bytes(budget)
        << " of mapped weights in memory, read in place, the "
        << "least recently used released first (largest component " << largest_component << ", "
        << format_bytes(largest_component_bytes) << ")";
      break;
  }
  return s.str();
}

std::string OffloadPlan::describe_residency() const {
  std::ostringstream s;
  s << "offload: " << offload_mode_name(mode);
  if (mode == OffloadMode::Group)
    s << ", " << group.blocks_per_group << (group.blocks_per_group == 1 ? " block" : " blocks")
      << " per group, prefetch";
  s << " (budget " << format_bytes(budget) << ", weights " << format_bytes(weight_bytes) << ")\n";
  for (const ComponentResidency& r : components) {
    s << "  " << r.name << " (" << format_bytes(r.bytes) << "): ";
    switch (mode) {
      case OffloadMode::None:
        s << "stays in memory";
        break;
      case OffloadMode::Model:
        s << "in memory while it runs, released after";
        break;
      case OffloadMode::Group:
        if (r.blocks == 0 || r.peak == r.bytes) {
          s << "in memory while it runs, released after";
        } else {
          s << format_bytes(r.outside_blocks) << " outside its " << r.blocks
            << " blocks while it runs, plus groups of " << group.blocks_per_group << " (largest "
            << format_bytes(r.largest_group) << "), the running one and the next: at most "
            << format_bytes(r.peak);
        }
        break;
      case OffloadMode::Sequential:
        s << "read in place, at most " << format_bytes(r.peak) << " resident, least recently used out first";
        break;
    }
    s << "\n";
  }
  s << "  expected peak: " << format_bytes(peak_weight_bytes) << " of weights, plus activations";
  return s.str();
}

}  // namespace kiln
