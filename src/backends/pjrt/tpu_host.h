// Whether this host has TPU chips, asked before libtpu is. libtpu on a host without TPUs does not fail: it
// asks the Google Cloud metadata server for the TPU's type and workers, retrying each question for minutes
// (about ten in all, measured), so `--device tpu` or `kiln info --devices` would hang where `pip install
// libtpu` was run off a TPU VM. The chips are PCI devices of Google's vendor id, which Linux lists in sysfs
// without any driver.
#pragma once

#include <string>

namespace kiln::pjrt {

// Google's PCI vendor id, as sysfs writes it in each device's `vendor` file.
inline constexpr const char* kGooglePciVendor = "0x1ae0";

// The PCI devices of Google's vendor id under `pci_devices` (sysfs' /sys/bus/pci/devices by default); 0 when
// the folder cannot be read.
int tpu_chip_count(const std::string& pci_devices = "/sys/bus/pci/devices");

// Throws a kiln::Error, before libtpu at `plugin_path` is loaded, when this host has no TPU chips, saying so
// and how to compile for a TPU without one (KILN_PJRT_CROSS_COMPILE). KILN_PJRT_TPU_CHIP_CHECK=0 skips the
// check (a TPU the PCI listing does not show).
void require_tpu_chips(const std::string& plugin_path);

}  // namespace kiln::pjrt
