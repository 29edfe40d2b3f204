// The dispatcher: maps (op name, device type) to a kernel and sends calls to the device's stream.
#pragma once

#include <string_view>

#include "runtime/op_call.h"

namespace kiln::runtime {

using Kernel = void (*)(const OpCall& call);

class KernelRegistry {
 public:
  void add(std::string_view op, DeviceType device, Kernel kernel);
  // nullptr when none is registered.
  Kernel find(std::string_view op, DeviceType device) const;
};

KernelRegistry& kernel_registry();

// Runs `call` on the device of its first output (or first input): enqueued on that device's stream.
// Throws kiln::Error at once when no kernel exists, naming the op and the device.
void dispatch(OpCall call);

}  // namespace kiln::runtime
