// A region: consecutive recorded op calls on one device that its backend runs as ONE program (the PJRT
// backend: one StableHLO module, one executable, one launch) instead of a kernel per call. The graph passes
// (graph/graph_plan.h) form regions from a deferred graph's flush or a traced forward for every backend that
// accepts calls into them (runtime::Backend::joins_region) and decide which values leave the region; the
// backend decides how the region runs (Backend::run_region).
#pragma once

#include <string>
#include <vector>

#include "runtime/op_call.h"

namespace kiln::runtime {

struct DeviceRegion {
  std::vector<OpCall> calls;  // in program order, every operand on one device
  // stored[i][o]: whether calls[i].outputs[o]'s storage must hold its value once the region has run (it is
  // read after the region, seen outside the graph, or existed before it). Every other value stays inside the
  // program: its storage is never written, so no memory is ever given to it.
  std::vector<std::vector<bool>> stored;

  Device device() const { return calls.front().outputs.front().device(); }
  // "region[add, linear, softmax](float32[2, 8], ...) -> float32[2, 8]": the calls and what it stores.
  std::string describe() const;
};

}  // namespace kiln::runtime
