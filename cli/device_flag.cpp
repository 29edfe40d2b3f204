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
  // On a PJRT device model and group offload copy weights from the host into the device's memory, and
  // --max-memory limits what Kiln holds there; sequential offload and packed copies are the cpu's. (--tp
  // puts rank r on the device r places after this one: device_of_rank.)
  KILN_CHECK(flags.offload != "sequential",
             "--device " << name
                         << ": --offload sequential runs on the cpu only (use --offload model or "
                            "group onto the device, or --device cpu)");
  KILN_CHECK(!flags.packed_weights, "--device "
                                        << name << ": --packed-weights " << *flags.packed_weights
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
