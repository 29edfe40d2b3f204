// A PJRT device's memory as Kiln counts it: every array Kiln holds there (a storage an op wrote, an offloaded
// weight brought in, a running program's scratch), each charged to the ledger of the execution context it was
// made in, under that context's own limit (kiln/runtime/device_ledger.h: a pipeline's budget on the device,
// `--max-memory` with `--device`). Running out, by that limit or by the plugin's own allocator, is one
// kiln::Error naming the device, the bytes asked, what was held there and what to do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "kiln/core/allocator.h"
#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/runtime/device_ledger.h"

namespace kiln::pjrt {

class DeviceMemory final : public Allocator {
 public:
  explicit DeviceMemory(Device device) : device_(device) {}
  // A storage's DeviceArray (backends/pjrt/device_array.h), its bytes counted as the storage's size.
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  // Counts `bytes` more held on the device (`what` is brought in) against the current context's ledger, which
  // it returns for release(); throws the out-of-memory error instead when that would pass its limit.
  // `allocation` false: scratch, not counted in memory_stats' allocations.
  std::shared_ptr<DeviceLedger> charge(size_t bytes, const std::string& what, bool allocation = true);
  void release(size_t bytes, DeviceLedger& ledger);
  bool limits_memory() const override { return true; }
  std::optional<DriverMemoryReport> driver_report() const override;

 private:
  Device device_;
};

// The memory of the PJRT device `device`.
DeviceMemory& device_memory(Device device);

// `bytes` counted on a device's memory for as long as it lives (an executable's scratch while it runs):
// checked against the limit like any array, so the constructor throws the out-of-memory error naming `what`.
class TransientCharge {
 public:
  TransientCharge(DeviceMemory& memory, size_t bytes, const std::string& what)
      : memory_(memory), bytes_(bytes) {
    if (bytes_ > 0) ledger_ = memory_.charge(bytes_, what, /*allocation=*/false);
  }
  ~TransientCharge() {
    if (ledger_) memory_.release(bytes_, *ledger_);
  }
  TransientCharge(const TransientCharge&) = delete;
  TransientCharge& operator=(const TransientCharge&) = delete;

 private:
  DeviceMemory& memory_;
  size_t bytes_;
  std::shared_ptr<DeviceLedger> ledger_;
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
