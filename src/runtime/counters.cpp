#include "kiln/runtime/counters.h"

#include <atomic>

#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"
#include "runtime/counter_updates.h"

namespace kiln {

namespace {

std::atomic<int64_t> g_ops_dispatched{0};
std::atomic<int64_t> g_kernels_launched{0};
std::atomic<int64_t> g_fused_kernels_launched{0};
std::atomic<int64_t> g_bytes_moved{0};
std::atomic<int64_t> g_graph_flushes{0};
std::atomic<int64_t> g_ops_eliminated{0};
std::atomic<int64_t> g_ops_fused{0};
std::atomic<int64_t> g_chains_fused{0};
std::atomic<int64_t> g_graphs_compiled{0};
std::atomic<int64_t> g_graph_cache_hits{0};

std::atomic<int64_t> g_kernels_compiled{0};
std::atomic<int64_t> g_kernel_cache_memory_hits{0};
std::atomic<int64_t> g_kernel_cache_disk_hits{0};
std::atomic<int64_t> g_kernel_cache_disk_misses{0};

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
void count_bytes_moved(int64_t bytes) {
  g_bytes_moved.fetch_add(bytes, std::memory_order_relaxed);
}
int64_t operand_bytes(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  int64_t n = 0;
  for (const auto* list : {&inputs, &outputs})
    for (const Tensor& t : *list)
      if (t.defined()) n += static_cast<int64_t>(t.nbytes());
  return n;
}
void count_fused_kernel_launched() {
  g_fused_kernels_launched.fetch_add(1, std::memory_order_relaxed);
}
void count_graph_flush(int64_t ops_eliminated, int64_t ops_fused, int64_t chains_fused) {
  g_chains_fused.fetch_add(chains_fused, std::memory_order_relaxed);
  g_graph_flushes.fetch_add(1, std::memory_order_relaxed);
  g_ops_eliminated.fetch_add(ops_eliminated, std::memory_order_relaxed);
  g_ops_fused.fetch_add(ops_fused, std::memory_order_relaxed);
}
void count_graph_compiled() {
  g_graphs_compiled.fetch_add(1, std::memory_order_relaxed);
}
void count_graph_cache_hit() {
  g_graph_cache_hits.fetch_add(1, std::memory_order_relaxed);
}
void count_kernel_compiled() {
  g_kernels_compiled.fetch_add(1, std::memory_order_relaxed);
}
void count_kernel_cache_memory_hit() {
  g_kernel_cache_memory_hits.fetch_add(1, std::memory_order_relaxed);
}
void count_kernel_cache_disk_hit() {
  g_kernel_cache_disk_hits.fetch_add(1, std::memory_order_relaxed);
}
void count_kernel_cache_disk_miss() {
  g_kernel_cache_disk_misses.fetch_add(1, std::memory_order_relaxed);
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
  c.fused_kernels_launched = g_fused_kernels_launched.load(std::memory_order_relaxed);
  c.bytes_moved = g_bytes_moved.load(std::memory_order_relaxed);
  c.graph_flushes = g_graph_flushes.load(std::memory_order_relaxed);
  c.ops_eliminated = g_ops_eliminated.load(std::memory_order_relaxed);
  c.ops_fused = g_ops_fused.load(std::memory_order_relaxed);
  c.chains_fused = g_chains_fused.load(std::memory_order_relaxed);
  c.graphs_compiled = g_graphs_compiled.load(std::memory_order_relaxed);
  c.graph_cache_hits = g_graph_cache_hits.load(std::memory_order_relaxed);
  c.kernels_compiled = g_kernels_compiled.load(std::memory_order_relaxed);
  c.kernel_cache_memory_hits = g_kernel_cache_memory_hits.load(std::memory_order_relaxed);
  c.kernel_cache_disk_hits = g_kernel_cache_disk_hits.load(std::memory_order_relaxed);
  c.kernel_cache_disk_misses = g_kernel_cache_disk_misses.load(std::memory_order_relaxed);
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
  for (auto* c : {&g_fused_kernels_launched, &g_bytes_moved, &g_graph_flushes, &g_ops_eliminated,
                  &g_ops_fused, &g_chains_fused, &g_graphs_compiled, &g_graph_cache_hits, &g_kernels_compiled,
                  &g_kernel_cache_memory_hits, &g_kernel_cache_disk_hits, &g_kernel_cache_disk_misses})
    c->store(0, std::memory_order_relaxed);
  for (size_t i = 0; i < kDeviceCount; ++i) {
    g_allocations_at_reset[i].store(memory_stats(kDevices[i]).allocations, std::memory_order_relaxed);
    reset_peak_memory(kDevices[i]);
  }
}

}  // namespace kiln
