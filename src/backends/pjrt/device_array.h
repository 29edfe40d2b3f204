// What a Storage on a PJRT device holds. Its allocator hands out a DeviceArray instead of bytes: PJRT buffers
// are immutable values that an executable returns, so "writing" a storage means replacing its array with the
// buffer an op produced. The array is flat (the storage's bytes as elements of the dtype that wrote it); the
// StableHLO of each op reads tensor views out of it (src/backends/pjrt/stablehlo/storage_views.h).
#pragma once

#include <memory>
#include <mutex>

#include "backends/pjrt/pjrt_client.h"
#include "kiln/core/tensor.h"

namespace kiln::pjrt {

class DeviceArray {
 public:
  // The buffer, or nullptr while no op has written the storage.
  std::shared_ptr<Buffer> buffer() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return buffer_;
  }
  void set(std::shared_ptr<Buffer> buffer) {
    std::lock_guard<std::mutex> lock(mutex_);
    buffer_ = std::move(buffer);
  }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<Buffer> buffer_;
};

// The array behind `t` (a tensor on a PJRT device).
inline DeviceArray& device_array(const Tensor& t) {
  return *static_cast<DeviceArray*>(t.storage()->data());
}

}  // namespace kiln::pjrt
