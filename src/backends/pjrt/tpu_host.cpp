#include "backends/pjrt/tpu_host.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "kiln/core/error.h"

namespace kiln::pjrt {

int tpu_chip_count(const std::string& pci_devices) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int count = 0;
  for (const auto& entry : fs::directory_iterator(pci_devices, ec)) {
    std::ifstream vendor(entry.path() / "vendor");
    std::string id;
    if (vendor >> id && id == kGooglePciVendor) ++count;
  }
  return count;
}

void require_tpu_chips(const std::string& plugin_path) {
  const char* check = std::getenv("KILN_PJRT_TPU_CHIP_CHECK");
  if (check && std::string_view(check) == "0") return;
  KILN_CHECK(
      tpu_chip_count() > 0,
      "device type tpu: this host has no TPU chips (no PCI device of Google's vendor id "
          << kGooglePciVendor << " under /sys/bus/pci/devices), so " << plugin_path
          << " is not loaded: off a TPU VM libtpu waits minutes for Google Cloud's metadata server. "
          << "Run on a TPU VM, or compile for a TPU from here with KILN_PJRT_CROSS_COMPILE=tpu:v5e (see "
          << "docs/devices.md); KILN_PJRT_TPU_CHIP_CHECK=0 skips this check");
}

}  // namespace kiln::pjrt
