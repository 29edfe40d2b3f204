// What Kiln asks of a plugin's client when it creates one (PJRT_Client_Create's named options), per device
// type. The CUDA plugin's defaults suit JAX, not a program that shares the GPU: it would take 75% of the
// GPU's memory at start-up and never give it back. Kiln asks it to grow its pool as arrays need it, up to
// 90%:
//   KILN_PJRT_MEMORY_FRACTION  the share of the GPU's memory the plugin's allocator may hold, in (0, 1]
//                              (default 0.9; the plugin reports it as the device's memory)
//   KILN_PJRT_PREALLOCATE      1: take all of it at start-up, as JAX does (faster first allocations, less
//                              fragmentation, nothing left for other programs); 0 (default): grow as needed
// The CPU and TPU plugins get none (the CPU plugin refuses options it does not know).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "kiln/core/device.h"

namespace kiln::pjrt {

struct ClientOption {
  using Value = std::variant<bool, float, int64_t, std::string>;
  std::string name;
  Value value;
};

// The options for a client of `type`'s plugin, read from the environment; a malformed variable is an error
// naming it and what it takes.
std::vector<ClientOption> client_options(DeviceType type);

}  // namespace kiln::pjrt
