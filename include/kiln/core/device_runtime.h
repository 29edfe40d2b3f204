// The per-device services: allocator, streams and weight tier. One DeviceRuntime exists for each device in
// use; the backend that drives the device provides it. This is plumbing between the runtime and the
// backends, not part of the public API (kiln/kiln.h).
#pragma once

#include <memory>

#include "kiln/core/allocator.h"
#include "kiln/core/device.h"
#include "kiln/core/stream.h"
#include "kiln/core/weight_tier.h"

namespace kiln {

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual Device device() const = 0;
  virtual Allocator& allocator() = 0;
  // A new ordered queue of work for this device; each execution context makes its own
  // (kiln/runtime/execution_context.h).
  virtual std::shared_ptr<Stream> create_stream() = 0;
  // How offloaded weights come in and go out of this device's reach (kiln/core/weight_tier.h).
  virtual WeightTier& weight_tier() = 0;
};

// The runtime for `device`; throws kiln::Error when no backend for that device type is built in.
DeviceRuntime& device_runtime(Device device);

}  // namespace kiln
