#include "backends/pjrt/device_memory.h"

#include <cstring>

#include "backends/pjrt/device_array.h"
#include "backends/pjrt/pjrt_backend.h"
#include "kiln/core/bytes.h"
#include "kiln/core/device_runtime.h"

namespace kiln::pjrt {

void* DeviceMemory::allocate(size_t bytes) {
  auto* array = new DeviceArray;
  try {
    array->set_ledger(charge(bytes, "an array of " + format_bytes(static_cast<int64_t>(bytes))));
  } catch (...) {
    delete array;
    throw;
  }
  return array;
}

void DeviceMemory::deallocate(void* ptr, size_t bytes) {
  auto* array = static_cast<DeviceArray*>(ptr);
  const std::shared_ptr<DeviceLedger> ledger = array->ledger();
  delete array;
  if (ledger) release(bytes, *ledger);
}

std::shared_ptr<DeviceLedger> DeviceMemory::charge(size_t bytes, const std::string& what, bool allocation) {
  std::shared_ptr<DeviceLedger> ledger = current_device_ledger(device_);
  if (!ledger->charge(static_cast<int64_t>(bytes)))
    fail_out_of_memory(device_, bytes, what,
                       format_bytes(ledger->held()) + " of the " + format_bytes(*ledger->limit()) +
                           " limit (--max-memory, kiln::set_memory_limit) already held in " +
                           ledger->owner());
  record_allocate(bytes, allocation);
  return ledger;
}

void DeviceMemory::release(size_t bytes, DeviceLedger& ledger) {
  ledger.release(static_cast<int64_t>(bytes));
  record_deallocate(bytes);
}

std::optional<DriverMemoryReport> DeviceMemory::driver_report() const {
  const DeviceHandle handle = device_handle(device_);
  return handle.client->memory_report(handle.local_index);
}

DeviceMemory& device_memory(Device device) {
  return static_cast<DeviceMemory&>(device_runtime(device).allocator());
}

void fail_out_of_memory(Device device, size_t bytes, const std::string& what, const std::string& cause) {
  KILN_FAIL(
      device.str() << " is out of memory: " << what << " needs " << format_bytes(static_cast<int64_t>(bytes))
                   << ", with " << format_bytes(memory_stats(device).current_bytes) << " held there by Kiln ("
                   << cause
                   << "). Offload the weights (kiln generate --offload model or group, or "
                      "enable_model_cpu_offload / enable_group_offload onto "
                   << device.str() << "), give a larger --max-memory, or make the image or batch smaller");
}

bool is_out_of_memory(const Error& e) {
  return std::strstr(e.what(), ": RESOURCE_EXHAUSTED: ") != nullptr;
}

}  // namespace kiln::pjrt
