// Optimising a recorded sequence of op calls (the lazy graph of DeferAndFuse, or a traced forward in compiled
// mode) into an execution plan:
//   1. dead code: calls whose outputs nobody can observe are dropped (an output is observable when a tensor
//      outside the graph still refers to its storage, or a live call reads it);
//   2. common subexpressions: a call identical to an earlier one (same op, attributes and operand views) is
//      dropped and its readers read the earlier result — e.g. every transformer block computing silu(temb);
//   0. fused ops: chains such as linear -> gelu -> gated residual or layer_norm -> adaLN modulation become
//      one fused op (graph/fusion_patterns.h);
//   3. fusion: runs of consecutive fusable elementwise calls (graph/fusion_rules.h) become one region for the
//      CPU JIT; values only read inside the region are never stored, so their tensors are never allocated.
//      Runs of consecutive calls on a device whose backend compiles whole regions (runtime::Backend::
//      joins_region: PJRT devices) become one runtime::DeviceRegion instead, whatever their ops; the same
//      rule says which of its values are stored. Calls on such a device never reach the CPU JIT. Under
//      group offload a region holds the calls of one weight group at most (PlanOptions::weight_group_of).
// The plan keeps the program order of everything it does not remove.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graph/elementwise_region.h"
#include "runtime/device_region.h"
#include "runtime/op_call.h"

namespace kiln::graph {

struct FusedGroup {
  ElementwiseRegion region{Shape{}};
  std::vector<Tensor> inputs;            // as the region declared them
  std::vector<double> scalars;           // in the region's scalar order
  std::vector<Tensor> outputs;           // contiguous, the region's shape
  std::vector<runtime::OpCall> members;  // the calls it replaces: run these if no kernel can be built
  std::string describe() const;          // "fused[mul, add, gelu_tanh](bfloat16[2, 64, 3072], ...) -> ..."
};

struct PlanStep {
  runtime::OpCall call;               // when `fused` and `region` are null: launch this call as it is
  std::shared_ptr<FusedGroup> fused;  // else: one fused kernel
  std::shared_ptr<runtime::DeviceRegion> region;  // or: one program run by the device's backend
};

struct PlanStats {
  int64_t calls = 0;          // calls recorded
  int64_t dead = 0;           // dropped as dead code
  int64_t common = 0;         // dropped as common subexpressions
  int64_t fused_calls = 0;    // calls replaced by fused kernels
  int64_t fused_kernels = 0;  // fused kernels in the plan
  int64_t patterns = 0;       // chains replaced by a fused op (graph/fusion_patterns.h)
  int64_t region_calls = 0;   // calls replaced by device regions
  int64_t regions = 0;        // device regions in the plan
};

struct PlanOptions {
  bool fuse = true;  // false: only dead code and common subexpressions
  // Storages the caller holds on to (e.g. a traced forward's outputs): their writers are never dropped and
  // their values always stored, whatever the reference counts say.
  std::vector<const Storage*> keep;
  // Group offload's weight groups (kiln/runtime/weight_groups.h): the group a weight's storage belongs to,
  // -1 for none. A device region ends where a call reads a weight of another group than the region's, so
  // that each group's weights are needed by programs of their own and can be sent out between them.
  // Unset: regions never split for groups.
  std::function<int(const Storage&)> weight_group_of;
};

// The weight groups group offload registered on the calling thread's execution context, for
// PlanOptions::weight_group_of; unset when group offload is off.
std::function<int(const Storage&)> current_weight_groups();

// Takes the calls (so that reference counts show which tensors the rest of the program still holds: the
// caller must not keep other copies of them) and returns the plan.
std::vector<PlanStep> plan_graph(std::vector<runtime::OpCall> calls, const PlanOptions& options,
                                 PlanStats* stats = nullptr);

}  // namespace kiln::graph
