#include "backends/pjrt/device_array.h"

#include "backends/pjrt/device_memory.h"
#include "backends/pjrt/pjrt_backend.h"
#include "backends/pjrt/stablehlo/storage_views.h"
#include "kiln/core/error.h"

namespace kiln::pjrt {

DeviceArray::~DeviceArray() {
  if (host_.defined() && buffer_ != nullptr && brought_in_)
    device_memory(device_).release(host_.nbytes(), *brought_in_);
}

void DeviceArray::set(std::shared_ptr<Buffer> buffer) {
  // Sending the weight out would lose the write: its host tensor is what comes back.
  KILN_CHECK(!host_.defined(), "an offloaded weight on " << device_.str() << " (kept as " << host_.str()
                                                         << ") cannot be written there; change weights (fuse "
                                                            "LoRA adapters) before offloading");
  std::lock_guard<std::mutex> lock(mutex_);
  buffer_ = std::move(buffer);
}

std::optional<Shape> DeviceArray::dims() const {
  if (host_.defined()) return hlo::device_array_dims(host_.shape());
  std::lock_guard<std::mutex> lock(mutex_);
  if (buffer_ == nullptr) return std::nullopt;
  return buffer_->dims();
}

Shape held_array_dims(const Tensor& t) {
  if (std::optional<Shape> dims = device_array(t).dims()) return *dims;
  return {static_cast<int64_t>(t.storage()->bytes() / t.element_size())};
}

size_t DeviceArray::bring_in() const {
  if (!host_.defined()) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  if (buffer_ != nullptr) return 0;
  bring_in_locked();
  return host_.nbytes();
}

void DeviceArray::send_out() const {
  if (!host_.defined()) return;
  std::shared_ptr<Buffer>
      dropped;  // freed outside the lock; an executable reading it holds its own reference
  std::shared_ptr<DeviceLedger> ledger;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (buffer_ == nullptr) return;
    dropped.swap(buffer_);
    ledger.swap(brought_in_);
  }
  if (ledger) device_memory(device_).release(host_.nbytes(), *ledger);
}

void DeviceArray::bring_in_locked() const {
  const size_t bytes = host_.nbytes();
  const std::string what = "an offloaded weight (kept as " + host_.str() + ")";
  DeviceMemory& memory = device_memory(device_);
  std::shared_ptr<DeviceLedger> ledger = memory.charge(bytes, what);
  try {
    const DeviceHandle handle = device_handle(device_);
    buffer_ = explain_out_of_memory(device_, bytes, what, [&] {
      return handle.client->buffer_from_host(host_.raw_data(), bytes, host_.dtype(),
                                             hlo::device_array_dims(host_.shape()), handle.local_index);
    });
  } catch (...) {
    memory.release(bytes, *ledger);
    throw;
  }
  brought_in_ = std::move(ledger);
}

}  // namespace kiln::pjrt
