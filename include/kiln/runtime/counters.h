// Counters the runtime keeps so that tests, benchmarks and users can see what work was done: how many op
// calls were dispatched, how many kernels actually ran, and each device's memory. A counter exists only
// once something increments it.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/core/device.h"

namespace kiln {

struct DeviceMemoryCounters {
  Device device = cpu;
  int64_t current_bytes = 0;  // held by live allocations now
  int64_t peak_bytes = 0;     // high-water mark since the last reset_counters() (or reset_peak_memory)
  int64_t allocations = 0;    // allocations made since the last reset_counters()
};

struct Counters {
  // Op calls handed to the runtime since the last reset (one per op that passed its argument checks).
  int64_t ops_dispatched = 0;
  // Kernels that started on a device stream since the last reset. Equal to ops_dispatched once the streams
  // are synchronised in eager modes, except for ops skipped because an earlier op on the stream failed.
  int64_t kernels_launched = 0;

  // Bytes the launched kernels read and write, counted as their operands' sizes (each input and output
  // once): the memory traffic a step needs at least, which fusion and compilation reduce.
  int64_t bytes_moved = 0;

  // DeferAndFuse and compiled mode (graph optimisation):
  int64_t graph_flushes = 0;   // lazy graphs optimised and launched
  int64_t ops_eliminated = 0;  // op calls dropped as dead code or common subexpressions
  int64_t ops_fused = 0;       // op calls replaced by fused kernels or device regions
  int64_t chains_fused = 0;    // linear/norm chains replaced by one fused op (linear_fused, norm_modulate)
  int64_t fused_kernels_launched = 0;  // of kernels_launched, how many were fused kernels
  // Fused-kernel code generation (the CPU JIT): kernels built by the compiler, and requests served from the
  // in-memory cache or from the on-disk cache (KILN_CACHE_DIR), and on-disk lookups that found nothing
  // usable.
  int64_t kernels_compiled = 0;
  int64_t kernel_cache_memory_hits = 0;
  int64_t kernel_cache_disk_hits = 0;
  int64_t kernel_cache_disk_misses = 0;
  // Compiled mode (Module::compile): executables traced and built, and calls served by a cached one.
  int64_t graphs_compiled = 0;
  int64_t graph_cache_hits = 0;

  // One entry per device with a runtime in this build.
  std::vector<DeviceMemoryCounters> memory;

  // The entry for `device`; throws kiln::Error when that device has none.
  const DeviceMemoryCounters& memory_of(Device device) const;
};

// A snapshot of all counters now (kernels still queued are not counted until they start).
Counters counters();
// Zeroes the op and kernel counts and the allocation counts, and sets each device's peak to its current
// bytes. Current bytes are a fact about live memory and are never reset.
void reset_counters();

}  // namespace kiln
