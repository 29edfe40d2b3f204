#include "kiln/core/allocator.h"

#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"

namespace kiln {

MemoryStats Allocator::stats() const {
  return MemoryStats{current_.load(), peak_.load(), count_.load(), reserved(), system_allocations()};
}

void Allocator::reset_peak() {
  peak_.store(current_.load());
}

void Allocator::record_allocate(size_t bytes, bool allocation) {
  const int64_t now = current_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  if (allocation) count_.fetch_add(1);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

void Allocator::record_deallocate(size_t bytes) {
  current_.fetch_sub(static_cast<int64_t>(bytes));
}

std::optional<DriverMemoryReport> driver_memory_report(Device device) {
  return device_runtime(device).allocator().driver_report();
}

void empty_cache(Device device) {
  device_runtime(device).allocator().empty_cache();
}

RepeatedShapesScope::RepeatedShapesScope(Device device) : allocator_(device_runtime(device).allocator()) {
  allocator_.enter_repeated_shapes();
}

RepeatedShapesScope::~RepeatedShapesScope() {
  allocator_.leave_repeated_shapes();
}

void mark_cache_idle(Device device) {
  device_runtime(device).allocator().mark_cache_idle();
}

}  // namespace kiln
