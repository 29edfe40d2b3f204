#include "cli/device_info.h"

#include <cstdio>
#include <optional>
#include <string>

#include "kiln/core/allocator.h"
#include "kiln/core/bytes.h"
#include "kiln/runtime/cross_compile.h"
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
    for (const DeviceDescription& d : status.devices) {
      std::printf("  %-10s %s backend: %s\n", d.device.str().c_str(), d.backend.c_str(),
                  d.description.c_str());
      if (d.device.type == DeviceType::CPU) continue;
      // What --offload auto plans with on the device (the CPU plugin reports nothing: it shares the host's).
      if (const std::optional<DriverMemoryReport> m = driver_memory_report(d.device))
        std::printf("  %-10s memory %s, %s in use\n", "", format_bytes(m->limit_bytes).c_str(),
                    format_bytes(m->in_use_bytes).c_str());
      else
        std::printf("  %-10s memory not reported by its plugin\n", "");
    }
  }
  // The compilers of devices this host need not have (KILN_PJRT_CROSS_COMPILE=tpu:v5e,cuda:h200;
  // docs/devices.md).
  for (const CrossCompilePlatform& p : cross_compile_platforms()) {
    std::string targets;
    for (const std::string& t : p.targets) targets += (targets.empty() ? "" : " ") + t;
    if (!p.plugin.empty()) {
      std::printf("cross-compile for %s: %s (with %s)\n", p.platform.c_str(), targets.c_str(),
                  p.plugin.c_str());
    } else {
      const std::string why = p.missing.substr(0, p.missing.find('\n'));  // not the list of places looked in
      std::printf("cross-compile for %s: none (%s)\n", p.platform.c_str(), why.c_str());
    }
  }
}

}  // namespace kiln::cli
