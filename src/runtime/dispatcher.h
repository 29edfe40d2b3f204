// The dispatcher: maps (op name, device type) to a kernel and sends calls where the calling thread's
// execution context (kiln/runtime/execution_context.h) says: its stream, its deferred graph, or the trace of
// a compiled forward (runtime/capture.h).
#pragma once

#include <string_view>

#include "runtime/op_call.h"

namespace kiln::runtime {

using Kernel = void (*)(const OpCall& call);

class KernelRegistry {
 public:
  // `op` must be in the op table (runtime/op_table.h).
  void add(std::string_view op, DeviceType device, Kernel kernel);
  // nullptr when none is registered.
  Kernel find(std::string_view op, DeviceType device) const;
};

// The registry, filled with the built-in backends' kernels on first use (runtime/backend.h).
KernelRegistry& kernel_registry();

// How every op reaches its kernel. Checks that a kernel exists (kiln::Error at once, naming the op and the
// device), counts the call, then follows the calling thread's EagerMode (kiln/runtime/eager_mode.h):
// launched on the context's stream, or recorded into its deferred graph.
void dispatch(OpCall call);

// Enqueues `call`'s kernel on the current context's stream of the device of its first output (or first
// input), whatever the mode (runtime/kernel_work.h): what dispatch() does in strict eager, and what a
// deferred graph's flush and a compiled program's run do for each kernel call.
void launch(OpCall call);

}  // namespace kiln::runtime
