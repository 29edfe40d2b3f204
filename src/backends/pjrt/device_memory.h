// A PJRT device's memory as Kiln counts it: every array Kiln holds there (a storage an op wrote, an offloaded
// weight brought in), under an optional limit (kiln::set_memory_limit, `--max-memory` on a device). Running
// out, by that limit or by the plugin's own allocator, is one kiln::Error naming the device, the bytes asked,
// what Kiln held there and what to do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "kiln/core/allocator.h"
#include "kiln/core/device.h"
#include "kiln/core/error.h"

namespace kiln::pjrt {

class DeviceMemory final : public Allocator {
 public:
  explicit DeviceMemory(Device device) : device_(device) {}
  // A storage's DeviceArray (backends/pjrt/device_array.h), its bytes counted as the storage's size.
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  // Counts `bytes` more held on the device (`what` is brought in); throws the out-of-memory error instead
  // when that would pass the limit. `allocation` false: scratch, not counted in memory_stats' allocations.
  void charge(size_t bytes, const std::string& what, bool allocation = true);
  void release(size_t bytes);
  void set_limit(std::optional<int64_t> bytes) override;
  std::optional<int64_t> limit() const override;
  std::optional<DriverMemoryReport> driver_report() const override;

 private:
  Device device_;
  mutable std::mutex mutex_;  // a check against the limit and its charge are one step
  std::optional<int64_t> limit_;
};

// The memory of the PJRT device `device`.
DeviceMemory& device_memory(Device device);

// `bytes` counted on a device's memory for as long as it lives (an executable's scratch while it runs):
// checked against the limit like any array, so the constructor throws the out-of-memory error naming `what`.
class TransientCharge {
 public:
  TransientCharge(DeviceMemory& memory, size_t bytes, const std::string& what)
      : memory_(memory), bytes_(bytes) {
    if (bytes_ > 0) memory_.charge(bytes_, what, /*allocation=*/false);
  }
  ~TransientCharge() {
    if (bytes_ > 0) memory_.release(bytes_);
  }
  TransientCharge(const TransientCharge&) = delete;
  TransientCharge& operator=(const TransientCharge&) = delete;

 private:
  DeviceMemory& memory_;
  size_t bytes_;
};

// Throws: `device` is out of memory; `what` needed `bytes`; `cause` is the limit's or the plugin's words.
[[noreturn]] void fail_out_of_memory(Device device, size_t bytes, const std::string& what,
                                     const std::string& cause);
// Whether `e` is a plugin call's failure for lack of device memory (RESOURCE_EXHAUSTED).
bool is_out_of_memory(const Error& e);

// Runs `f`, a transfer or an executable on `device` needing `bytes` there; the plugin running out of memory
// becomes fail_out_of_memory's error naming `what`.
template <class F>
auto explain_out_of_memory(Device device, size_t bytes, const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    if (!is_out_of_memory(e)) throw;
    fail_out_of_memory(device, bytes, what, std::string("the plugin said: ") + e.what());
  }
}

}  // namespace kiln::pjrt
