#include "kiln/core/allocator.h"

#include "kiln/core/device_runtime.h"

namespace kiln {

MemoryStats Allocator::stats() const {
  return MemoryStats{current_.load(), peak_.load(), count_.load(), reserved()};
}

void Allocator::reset_peak() {
  peak_.store(current_.load());
}

void Allocator::record_allocate(size_t bytes) {
  const int64_t now = current_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  count_.fetch_add(1);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

void Allocator::record_deallocate(size_t bytes) {
  current_.fetch_sub(static_cast<int64_t>(bytes));
}

void empty_cache(Device device) {
  device_runtime(device).allocator().empty_cache();
}

}  // namespace kiln
