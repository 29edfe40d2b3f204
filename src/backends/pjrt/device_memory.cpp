#include "backends/pjrt/device_memory.h"

#include <cstring>

#include "backends/pjrt/device_array.h"
#include "backends/pjrt/pjrt_backend.h"
#include "kiln/core/bytes.h"
#include "kiln/core/device_runtime.h"

namespace kiln::pjrt {

void* DeviceMemory::allocate(size_t bytes) {
  charge(bytes, "an array of " + format_bytes(static_cast<int64_t>(bytes)));
  return new DeviceArray;
}

void DeviceMemory::deallocate(void* ptr, size_t bytes) {
  delete static_cast<DeviceArray*>(ptr);
  release(bytes);
}

void DeviceMemory::charge(size_t bytes, const std::string& what, bool allocation) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (limit_) {
    const int64_t held = stats().current_bytes;
    if (held + static_cast<int64_t>(bytes) > *limit_)
      fail_out_of_memory(device_, bytes, what,
                         format_bytes(held) + " of its " + format_bytes(*limit_) +
                             " limit (--max-memory, kiln::set_memory_limit) already held");
  }
  record_allocate(bytes, allocation);
}

void DeviceMemory::release(size_t bytes) {
  record_deallocate(bytes);
}

void DeviceMemory::set_limit(std::optional<int64_t> bytes) {
  KILN_CHECK(!bytes || *bytes > 0, "a memory limit must be positive, got " << *bytes << " bytes");
  std::lock_guard<std::mutex> lock(mutex_);
  limit_ = bytes;
}

std::optional<int64_t> DeviceMemory::limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return limit_;
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
