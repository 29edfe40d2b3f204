#include "cli/device_flag.h"

#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"

namespace kiln::cli {

Device parse_device_flag(const std::string& name, const ExecutionFlags& flags) {
  Device device = cpu;
  try {
    device = Device(name);
  } catch (const Error& e) {
    KILN_FAIL("--device " << name << ": " << e.what());
  }
  if (device.type == DeviceType::CPU) return device;
  // On a PJRT device every weight is resident there (any --mode): offloading streams weights to the cpu's
  // kernels and packed copies are the cpu's. (--tp puts rank r on the device r places after this one:
  // device_of_rank.)
  const std::string refused = "--device " + name + " keeps every component resident on the device; ";
  KILN_CHECK(flags.offload == "auto" || flags.offload == "none",
             refused << "--offload " << flags.offload
                     << " runs on the cpu only for now (drop it or use --device cpu)");
  KILN_CHECK(!flags.max_memory,
             refused << "--max-memory " << *flags.max_memory
                     << " budgets the cpu's memory only for now (drop it or use --device cpu)");
  KILN_CHECK(!flags.packed_weights, refused
                                        << "--packed-weights " << *flags.packed_weights
                                        << " sizes the cpu's packed copies (drop it or use --device cpu)");
  return device;
}

Device device_of_rank(const Device& device, int rank) {
  if (device.type == DeviceType::CPU) return device;
  return Device(device.type, device.index + rank);
}

void require_device(const Device& device) {
  device_runtime(device);
}

}  // namespace kiln::cli
