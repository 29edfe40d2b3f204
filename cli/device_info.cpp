#include "cli/device_info.h"

#include <cstdio>
#include <string>

#include "kiln/runtime/devices.h"

namespace kiln::cli {

void print_devices() {
  for (const DeviceTypeStatus& status : available_devices()) {
    const std::string type(device_type_name(status.type));
    if (status.devices.empty()) {
      std::printf("%s: none (%s)\n", type.c_str(), status.unavailable_because.c_str());
      continue;
    }
    std::printf("%s: %zu device%s\n", type.c_str(), status.devices.size(),
                status.devices.size() == 1 ? "" : "s");
    for (const DeviceDescription& d : status.devices)
      std::printf("  %-10s %s backend: %s\n", d.device.str().c_str(), d.backend.c_str(),
                  d.description.c_str());
  }
}

}  // namespace kiln::cli
