#include "kiln/core/storage.h"

#include "kiln/core/device_runtime.h"

namespace kiln {

std::shared_ptr<Storage> Storage::allocate(size_t bytes, Device device) {
  void* p = device_runtime(device).allocator().allocate(bytes);
  return std::shared_ptr<Storage>(new Storage(p, bytes, device, nullptr, false));
}

std::shared_ptr<Storage> Storage::borrow(void* data, size_t bytes, Device device,
                                         std::shared_ptr<void> owner) {
  return std::shared_ptr<Storage>(new Storage(data, bytes, device, std::move(owner), true));
}

Storage::~Storage() {
  derived_.reset();
  if (!borrowed_ && data_) device_runtime(device_).allocator().deallocate(data_, bytes_);
}

void synchronize(Device device) {
  device_runtime(device).stream().synchronize();
}
MemoryStats memory_stats(Device device) {
  return device_runtime(device).allocator().stats();
}
void reset_peak_memory(Device device) {
  device_runtime(device).allocator().reset_peak();
}

}  // namespace kiln
