// Which devices this process can use: Kiln's own CPU, and the devices of each installed PJRT plugin (TPU,
// NVIDIA GPU, XLA's CPU). `kiln info --devices` prints this list.
#pragma once

#include <string>
#include <vector>

#include "kiln/core/device.h"

namespace kiln {

struct DeviceDescription {
  Device device;
  std::string backend;      // "cpu", "pjrt"
  std::string description;  // what the backend says about it: the plugin's device kind, its version
};

struct DeviceTypeStatus {
  DeviceType type;
  std::vector<DeviceDescription> devices;  // empty when none is reachable
  std::string unavailable_because;         // why not, naming what to install; empty when devices are listed
};

// Every device type this build knows, with its devices or the reason there are none. Loading a PJRT plugin
// is part of asking, so this can take seconds the first time.
std::vector<DeviceTypeStatus> available_devices();

}  // namespace kiln
