// What one execution context holds on a device with memory of its own (a PJRT device), under that context's
// own limit: a pipeline's memory budget on a device (DiffusionPipeline::set_memory_budget, --max-memory with
// --device) limits what its context holds there, never what another pipeline's does, so that pipelines with
// different budgets run side by side in one process (kiln serve's model pool). Every array a context charges
// keeps its ledger and gives the bytes back to it when freed, whichever context is current then.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "kiln/core/device.h"

namespace kiln {

class DeviceLedger {
 public:
  DeviceLedger(Device device, std::string owner);

  Device device() const { return device_; }
  const std::string& owner() const { return owner_; }  // the context's name, in messages
  // Counts `bytes` more held; false (nothing counted) when that would pass the limit.
  bool charge(int64_t bytes);
  void release(int64_t bytes);
  int64_t held() const;
  void set_limit(std::optional<int64_t> bytes);
  std::optional<int64_t> limit() const;

 private:
  Device device_;
  std::string owner_;
  mutable std::mutex mutex_;  // a check against the limit and its charge are one step
  int64_t held_ = 0;
  std::optional<int64_t> limit_;
};

// The current context's ledger on `device` (kiln/runtime/execution_context.h; made on first use): what an
// allocation on the device is charged to.
std::shared_ptr<DeviceLedger> current_device_ledger(Device device);

// The most bytes the current context may hold on `device` (weights brought in, arrays and a running program's
// scratch; none when absent): past it, an allocation there throws naming the device, the bytes asked and the
// limit. Only devices with memory of their own take one (the cpu's budget is the offload plan's:
// DiffusionPipeline::set_memory_budget); throws naming the device otherwise.
void set_memory_limit(Device device, std::optional<int64_t> bytes);
std::optional<int64_t> memory_limit(Device device);
// The sum of every live context's limit on `device` (what Kiln may hold there in all), none when no context
// sets one: the figure memory_stats reporting shows.
std::optional<int64_t> total_memory_limit(Device device);

}  // namespace kiln
