// The CPU's weight tier (kiln/core/weight_tier.h): an offloaded weight stays in its memory-mapped checkpoint
// file; bringing it in maps its pages into the process, sending it out hands them back to the OS.
#pragma once

#include "kiln/core/weight_tier.h"

namespace kiln {

class HostWeightTier final : public WeightTier {
 public:
  size_t bring_in(const Storage& weight, const std::atomic<bool>& cancel) override;
  void send_out(const Storage& weight) override;
  void evict(const Storage& weight) override;
  Tensor offloaded(const Tensor& on_host) override;
};

}  // namespace kiln
