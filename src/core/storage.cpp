#include "kiln/core/storage.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "kiln/core/device_runtime.h"

namespace kiln {

std::shared_ptr<Storage> Storage::allocate(size_t bytes, Device device, Lifetime lifetime) {
  device_runtime(device);  // an unknown device fails here, at the call that asked for it
  return std::shared_ptr<Storage>(
      new Storage(nullptr, bytes, device, nullptr, false, false, false, lifetime));
}

void* Storage::materialize() const {
  std::lock_guard<std::mutex> lock(materialize_mutex_);
  void* p = data_.load(std::memory_order_relaxed);
  if (p == nullptr) {
    Allocator& allocator = device_runtime(device_).allocator();
    p = lifetime_ == Lifetime::kLongLived ? allocator.allocate_long_lived(bytes_)
                                          : allocator.allocate(bytes_);
    data_.store(p, std::memory_order_release);
  }
  return p;
}

std::shared_ptr<Storage> Storage::borrow(void* data, size_t bytes, Device device,
                                         std::shared_ptr<void> owner) {
  return std::shared_ptr<Storage>(new Storage(data, bytes, device, std::move(owner), true));
}

std::shared_ptr<Storage> Storage::borrow_file_pages(const void* data, size_t bytes, Device device,
                                                    std::shared_ptr<void> owner) {
  return std::shared_ptr<Storage>(
      new Storage(const_cast<void*>(data), bytes, device, std::move(owner), true, /*file_pages=*/true));
}

std::shared_ptr<Storage> Storage::borrow_host_backed(void* handle, size_t bytes, Device device,
                                                     std::shared_ptr<void> owner) {
  return std::shared_ptr<Storage>(new Storage(handle, bytes, device, std::move(owner), true,
                                              /*file_pages=*/false, /*host_backed=*/true));
}

namespace {

// The whole pages inside [begin, begin + bytes): the pages at either end may hold a neighbouring tensor that
// is still read in place.
std::pair<void*, size_t> inner_pages(const void* begin, size_t bytes) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto b = reinterpret_cast<uintptr_t>(begin);
  const uintptr_t first = (b + page - 1) / page * page, last = (b + bytes) / page * page;
  return {reinterpret_cast<void*>(first), last > first ? last - first : 0};
}

}  // namespace

void Storage::drop_resident_pages() const {
  if (!file_pages_ || bytes_ == 0) return;
  const auto [first, length] = inner_pages(data_.load(std::memory_order_acquire), bytes_);
  // MADV_DONTNEED on a private, read-only file mapping only discards clean pages, which the next access
  // reads back from the file; failure just leaves them resident.
  if (length > 0) madvise(first, length, MADV_DONTNEED);
}

size_t Storage::prefetch_resident_pages(const std::atomic<bool>& cancel) const {
  if (!file_pages_ || bytes_ == 0) return 0;
  const auto [first, length] = inner_pages(data_.load(std::memory_order_acquire), bytes_);
  if (length == 0) return 0;
  // Read-ahead for the whole range first, so the disk sees large requests; then map slice by slice,
  // checking for cancellation between slices (a pipeline releasing the weights waits for this).
  madvise(first, length, MADV_WILLNEED);
  constexpr size_t kSlice = size_t{8} << 20;
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto* bytes = static_cast<const volatile unsigned char*>(first);
  size_t done = 0;
  while (done < length && !cancel.load(std::memory_order_relaxed)) {
    const size_t n = std::min(kSlice, length - done);
#ifdef MADV_POPULATE_READ
    // Linux 5.14 and later; older kernels refuse it (EINVAL) and the pages are touched one by one instead.
    if (madvise(const_cast<unsigned char*>(bytes + done), n, MADV_POPULATE_READ) != 0)
#endif
      for (size_t at = 0; at < n; at += page) (void)bytes[done + at];
    done += n;
  }
  return done;
}

void Storage::evict_file_pages() const {
  if (!file_pages_ || bytes_ == 0) return;
  const auto [first, length] = inner_pages(data_.load(std::memory_order_acquire), bytes_);
  if (length == 0) return;
#ifdef MADV_PAGEOUT
  // Reclaims the pages only this process maps, page cache included; refused on kernels before 5.4 (EINVAL),
  // where dropping them from this process is all that is done.
  madvise(first, length, MADV_PAGEOUT);
#endif
  madvise(first, length, MADV_DONTNEED);
}

Storage::~Storage() {
  derived_.clear();  // derived forms first: a packed copy may refer to these bytes
  void* p = data_.load(std::memory_order_acquire);
  if (borrowed_ || p == nullptr) return;
  Allocator& allocator = device_runtime(device_).allocator();
  if (lifetime_ == Lifetime::kLongLived) {
    allocator.release(p, bytes_);
  } else {
    allocator.deallocate(p, bytes_);
  }
}

MemoryStats memory_stats(Device device) {
  return device_runtime(device).allocator().stats();
}
void reset_peak_memory(Device device) {
  device_runtime(device).allocator().reset_peak();
}

}  // namespace kiln
