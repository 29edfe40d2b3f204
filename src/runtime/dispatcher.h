// The dispatcher: maps (op name, device type) to a kernel and sends calls to the device's stream.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/op_call.h"

namespace kiln::graph {
class ElementwiseRegion;
class FusedKernel;
}  // namespace kiln::graph

namespace kiln::runtime {

using Kernel = void (*)(const OpCall& call);

class KernelRegistry {
 public:
  void add(std::string_view op, DeviceType device, Kernel kernel);
  // nullptr when none is registered.
  Kernel find(std::string_view op, DeviceType device) const;
};

KernelRegistry& kernel_registry();

// How every op reaches its kernel. Checks that a kernel exists (kiln::Error at once, naming the op and the
// device), counts the call, then follows the calling thread's EagerMode (kiln/runtime/eager_mode.h):
// launched on the device's stream, or recorded into the lazy graph (runtime/deferred.h).
void dispatch(OpCall call);

// Enqueues `call`'s kernel on the stream of the device of its first output (or first input), whatever the
// mode: what dispatch() does in strict eager, and what a lazy-graph flush does for ops it does not fuse.
void launch(OpCall call);

// The fused counterpart of launch(): enqueues `kernel` (built by the CPU JIT for `region`) on the stream of
// the outputs' device, counting it as one (fused) kernel launch. `describe` names it in errors.
void launch_fused(std::shared_ptr<const graph::FusedKernel> kernel,
                  std::shared_ptr<const graph::ElementwiseRegion> region, std::vector<double> scalars,
                  std::vector<Tensor> inputs, std::vector<Tensor> outputs,
                  std::function<std::string()> describe);

}  // namespace kiln::runtime
