#include "kiln/runtime/counters.h"

#include <atomic>

#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"
#include "runtime/counter_updates.h"

namespace kiln {

namespace {

std::atomic<int64_t> g_ops_dispatched{0};
std::atomic<int64_t> g_kernels_launched{0};

// The devices this build has a runtime for.
const Device kDevices[] = {cpu};
constexpr size_t kDeviceCount = sizeof(kDevices) / sizeof(kDevices[0]);

// Allocator counts only grow; the counters report them relative to the last reset.
std::atomic<int64_t> g_allocations_at_reset[kDeviceCount] = {};

}  // namespace

namespace runtime {
void count_op_dispatched() {
  g_ops_dispatched.fetch_add(1, std::memory_order_relaxed);
}
void count_kernel_launched() {
  g_kernels_launched.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace runtime

const DeviceMemoryCounters& Counters::memory_of(Device device) const {
  for (const auto& m : memory)
    if (m.device == device) return m;
  KILN_FAIL("counters: no memory counters for device " << device.str());
}

Counters counters() {
  Counters c;
  c.ops_dispatched = g_ops_dispatched.load(std::memory_order_relaxed);
  c.kernels_launched = g_kernels_launched.load(std::memory_order_relaxed);
  for (size_t i = 0; i < kDeviceCount; ++i) {
    const MemoryStats s = memory_stats(kDevices[i]);
    c.memory.push_back({kDevices[i], s.current_bytes, s.peak_bytes,
                        s.allocations - g_allocations_at_reset[i].load(std::memory_order_relaxed)});
  }
  return c;
}

void reset_counters() {
  g_ops_dispatched.store(0, std::memory_order_relaxed);
  g_kernels_launched.store(0, std::memory_order_relaxed);
  for (size_t i = 0; i < kDeviceCount; ++i) {
    g_allocations_at_reset[i].store(memory_stats(kDevices[i]).allocations, std::memory_order_relaxed);
    reset_peak_memory(kDevices[i]);
  }
}

}  // namespace kiln
