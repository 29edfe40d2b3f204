#include "backends/pjrt/offloaded_weight.h"

#include "backends/pjrt/device_array.h"
#include "kiln/core/error.h"
#include "kiln/core/shape.h"
#include "kiln/core/storage.h"
#include "kiln/core/tensor.h"

namespace kiln::pjrt {

namespace {

// Weights resident on the device (pipe.to) have no host copy to come back from: the tier leaves them.
const DeviceArray* host_backed(const Storage& weight) {
  if (!weight.is_host_backed()) return nullptr;
  return static_cast<const DeviceArray*>(weight.data());
}

}  // namespace

size_t OffloadedWeightTier::bring_in(const Storage& weight, const std::atomic<bool>& cancel) {
  const DeviceArray* array = host_backed(weight);
  return array != nullptr && !cancel.load() ? array->bring_in() : 0;
}

void OffloadedWeightTier::send_out(const Storage& weight) {
  if (const DeviceArray* array = host_backed(weight)) {
    array->send_out();
    // The host's file pages go back to the OS too (the page cache keeps them for the next copy).
    array->host().storage()->drop_resident_pages();
  }
}

void OffloadedWeightTier::evict(const Storage& weight) {
  if (const DeviceArray* array = host_backed(weight)) {
    array->send_out();
    array->host().storage()->evict_file_pages();
  }
}

Tensor OffloadedWeightTier::offloaded(const Tensor& on_host) {
  KILN_CHECK(on_host.device().type == DeviceType::CPU,
             "offloading to " << device_.str() << " keeps weights on the cpu; got " << on_host.str());
  // A view (a slice of a fused weight) is copied out once, so that the device copies a dense array.
  Tensor dense = on_host.is_contiguous() ? on_host : on_host.contiguous();
  if (dense.numel() == 0) return dense.to(device_);
  dense.storage()->wait_for_writes();  // loading's conversions, queued on the cpu's stream
  auto array = std::make_shared<DeviceArray>(dense, device_);
  DeviceArray* handle = array.get();
  return Tensor(Storage::borrow_host_backed(handle, dense.nbytes(), device_, std::move(array)), dense.shape(),
                contiguous_strides(dense.shape()), 0, dense.dtype());
}

}  // namespace kiln::pjrt
