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
//      rule says which of its values are stored. Calls on such a device never reach the CPU JIT.
// The plan keeps the program order of everything it does not remove.
#pragma once

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
};

// Takes the calls (so that reference counts show which tensors the rest of the program still holds: the
// caller must not keep other copies of them) and returns the plan.
std::vector<PlanStep> plan_graph(std::vector<runtime::OpCall> calls, const PlanOptions& options,
                                 PlanStats* stats = nullptr);

}  // namespace kiln::graph
