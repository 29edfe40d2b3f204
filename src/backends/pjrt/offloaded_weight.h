// A PJRT device's weight tier (kiln/core/weight_tier.h): an offloaded weight is a device tensor whose array
// is backed by its host tensor (the memory-mapped checkpoint, or the host copy the pipeline converted), so
// bringing it in is a copy to device memory, sending it out frees that copy, and evicting also hands the
// host's file pages back to the OS. Model offload evicts a component once it has run, group offload sends
// groups out and brings the next one in from its prefetch thread, and any kernel that reads a weight whose
// copy is absent brings it in first (DeviceArray::buffer).
#pragma once

#include "kiln/core/device.h"
#include "kiln/core/weight_tier.h"

namespace kiln::pjrt {

class OffloadedWeightTier final : public WeightTier {
 public:
  explicit OffloadedWeightTier(Device device) : device_(device) {}
  size_t bring_in(const Storage& weight, const std::atomic<bool>& cancel) override;
  void send_out(const Storage& weight) override;
  void evict(const Storage& weight) override;
  Tensor offloaded(const Tensor& on_host) override;

 private:
  Device device_;
};

}  // namespace kiln::pjrt
