// What a Storage on a PJRT device holds. Its allocator hands out a DeviceArray instead of bytes: PJRT buffers
// are immutable values that an executable returns, so "writing" a storage means replacing its array with the
// buffer an op produced. The array holds the storage's bytes as elements of the dtype that wrote it, as a
// matrix of the innermost dim of the tensor that wrote it whole (or flat); the StableHLO of each op reads
// tensor views out of it (src/backends/pjrt/stablehlo/storage_views.h).
//
// An offloaded weight's array is backed by its host tensor instead (backends/pjrt/offloaded_weight.h): its
// buffer is copied from the host when brought in or first read, counted in the device's memory while it
// exists, and dropped when sent out; no op writes it.
#pragma once

#include <memory>
#include <mutex>

#include <optional>
#include "kiln/runtime/device_ledger.h"

#include "backends/pjrt/pjrt_client.h"
#include "kiln/core/tensor.h"

namespace kiln::pjrt {

class DeviceArray {
 public:
  DeviceArray() = default;
  // Backed by `host`, a dense cpu tensor that stays, for a weight on `device`.
  DeviceArray(Tensor host, Device device) : host_(std::move(host)), device_(device) {}
  ~DeviceArray();
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  // The buffer, or nullptr while no op has written the storage; a host-backed array's is brought in first.
  std::shared_ptr<Buffer> buffer() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (buffer_ == nullptr && host_.defined()) bring_in_locked();
    return buffer_;
  }
  void set(std::shared_ptr<Buffer> buffer);
  // The dims of the array: its buffer's, a host-backed array's (hlo::device_array_dims of its host shape,
  // whether brought in or not), or nullopt while no op has written the storage.
  std::optional<Shape> dims() const;

  bool host_backed() const { return host_.defined(); }
  const Tensor& host() const { return host_; }
  // For a host-backed array: copies the host bytes to the device unless they are there; returns the bytes
  // copied.
  size_t bring_in() const;
  // For a host-backed array: frees the device's copy (a read brings it back).
  void send_out() const;
  // The ledger the array's allocation was charged to (DeviceMemory::allocate), given back its bytes when
  // freed.
  void set_ledger(std::shared_ptr<DeviceLedger> ledger) { ledger_ = std::move(ledger); }
  const std::shared_ptr<DeviceLedger>& ledger() const { return ledger_; }

 private:
  void bring_in_locked() const;

  mutable std::mutex mutex_;
  mutable std::shared_ptr<Buffer> buffer_;
  std::shared_ptr<DeviceLedger> ledger_;
  // A host-backed array's copy on the device: the ledger its bytes were charged to while it is there.
  mutable std::shared_ptr<DeviceLedger> brought_in_;
  Tensor host_;
  Device device_ = cpu;
};

// The array behind `t` (a tensor on a PJRT device).
inline DeviceArray& device_array(const Tensor& t) {
  return *static_cast<DeviceArray*>(t.storage()->data());
}

// The dims of the array behind `t`'s storage (hlo::ArrayDims for the modules of `t`'s ops): its array's, flat
// while no op has written it (what buffer_before gives then).
Shape held_array_dims(const Tensor& t);

}  // namespace kiln::pjrt
