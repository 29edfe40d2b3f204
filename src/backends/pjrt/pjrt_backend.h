// The PJRT backend: devices reached through a PJRT plugin — "tpu" (libtpu), "cuda" (the NVIDIA plugin of
// jax-cuda13-pjrt / jax-cuda12-pjrt) and "xla-cpu" (XLA's CPU compiler, the plugin CI tests with). One client
// per device type, loaded on first use (backends/pjrt/plugin_locator.h finds the plugin); every op it
// supports runs as a StableHLO executable compiled once per (op, shapes, dtypes, attributes) and cached
// (backends/pjrt/executable_cache.h).
#pragma once

#include <memory>

#include "backends/pjrt/pjrt_client.h"
#include "runtime/backend.h"

namespace kiln::pjrt {

runtime::Backend& pjrt_backend();

// The client driving `device` and the device's index among its addressable devices (for the kernels).
struct DeviceHandle {
  std::shared_ptr<Client> client;
  int local_index = 0;
};
DeviceHandle device_handle(Device device);

}  // namespace kiln::pjrt
