// Per-device memory: aligned allocations with current and peak byte counters that tests and benchmarks read.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "kiln/core/device.h"

namespace kiln {

struct MemoryStats {
  int64_t current_bytes = 0;  // bytes held by live allocations now
  int64_t peak_bytes = 0;     // high-water mark since start or the last reset_peak()
  int64_t allocations = 0;    // number of allocate() calls
  int64_t reserved_bytes =
      0;  // bytes held from the system: live allocations rounded to blocks plus the cache
  // allocate() calls that took fresh memory from the system; the others were served from a cache. In a loop
  // that repeats its shapes this stops growing after the first iterations.
  int64_t system_allocations = 0;
};

// A device's memory as its driver reports it (a PJRT plugin's PJRT_Device_MemoryStats): the most its
// allocator may hold and what is in use there now, by anyone (Kiln's arrays, XLA's scratch and caches).
struct DriverMemoryReport {
  int64_t limit_bytes = 0;
  int64_t in_use_bytes = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory aligned to at least 64 bytes; throws kiln::Error when the device is out of memory.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  // For memory that lives as long as a weight (a packed copy): an allocator with a cache serves it from a
  // cached block only where one fits and otherwise makes room by returning cached blocks, whatever their
  // sizes, rather than growing beside them; release() gives it straight back to the system. Allocators
  // without a cache treat them as allocate() and deallocate().
  virtual void* allocate_long_lived(size_t bytes) { return allocate(bytes); }
  virtual void release(void* ptr, size_t bytes) { deallocate(ptr, bytes); }
  // Returns memory kept for reuse (freed blocks in a cache) to the system; allocators without one do nothing.
  virtual void empty_cache() {}
  // Between these, the work is a loop whose iterations ask for the same sizes (a denoising loop): a cache
  // miss keeps the cached blocks whose sizes recur and takes new memory, so that after an iteration or two
  // nothing misses. Outside, a miss recycles cached blocks (idle ones first), keeping reserved memory near
  // the live peak. Counted: loops of concurrent callers may overlap. Use RepeatedShapesScope.
  virtual void enter_repeated_shapes() {}
  virtual void leave_repeated_shapes() {}
  // Says that the work whose allocation sizes recurred until now is over (a pipeline's component has run):
  // an allocator with a cache treats every cached block as idle, to be recycled by the next allocations or
  // returned to the system, rather than kept beside the next component's blocks. Nothing is freed here.
  virtual void mark_cache_idle() {}

  MemoryStats stats() const;
  void reset_peak();
  // Whether the device's memory is its own, so that a context may limit what it holds there
  // (kiln/runtime/device_ledger.h): a PJRT device's is, the cpu's (the host's) is not.
  virtual bool limits_memory() const { return false; }
  // What the device's driver says of its memory; absent where it says nothing (the cpu, the CPU plugin).
  virtual std::optional<DriverMemoryReport> driver_report() const { return std::nullopt; }

 protected:
  // `allocation` false: bytes held without an allocate() call (a program's scratch while it runs), counted in
  // the bytes but not in `allocations`.
  void record_allocate(size_t bytes, bool allocation = true);
  void record_deallocate(size_t bytes);
  // What stats() reports as reserved_bytes and system_allocations; an allocator without a cache holds
  // exactly its live bytes and takes every allocation from the system.
  virtual int64_t reserved() const { return current_.load(); }
  virtual int64_t system_allocations() const { return count_.load(); }

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> count_{0};
};

// Returns the memory that `device`'s allocator caches for reuse to the system (like torch.cuda.empty_cache);
// live tensors are untouched.
void empty_cache(Device device = cpu);

// Marks a loop that asks for the same sizes every iteration (Allocator::enter_repeated_shapes) on `device`'s
// allocator for its lifetime: the pipelines' denoising loop, bench/compare's steps. Code that calls a
// transformer in a loop of its own gets the same reuse with one of these around the loop.
class RepeatedShapesScope {
 public:
  explicit RepeatedShapesScope(Device device = cpu);
  ~RepeatedShapesScope();
  RepeatedShapesScope(const RepeatedShapesScope&) = delete;
  RepeatedShapesScope& operator=(const RepeatedShapesScope&) = delete;

 private:
  Allocator& allocator_;
};

// See Allocator::mark_cache_idle; the pipelines call it for each component's device once it has run.
void mark_cache_idle(Device device = cpu);

// `device`'s allocator counters (torch.cuda.memory_stats), and a reset of its peak.
MemoryStats memory_stats(Device device = cpu);
void reset_peak_memory(Device device = cpu);
// What `device`'s driver reports of its memory (its size and what is in use there); absent when it reports
// nothing: the cpu and the CPU plugin do not, the CUDA and TPU plugins do.
std::optional<DriverMemoryReport> driver_memory_report(Device device);

}  // namespace kiln
