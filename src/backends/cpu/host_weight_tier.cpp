#include "backends/cpu/host_weight_tier.h"

#include "kiln/core/storage.h"
#include "kiln/core/tensor.h"

namespace kiln {

// Weights that are not file pages (converted or owned copies) have nowhere to go: the three are no-ops there.
size_t HostWeightTier::bring_in(const Storage& weight, const std::atomic<bool>& cancel) {
  return weight.prefetch_resident_pages(cancel);
}

void HostWeightTier::send_out(const Storage& weight) {
  weight.drop_resident_pages();
}

void HostWeightTier::evict(const Storage& weight) {
  weight.evict_file_pages();
}

Tensor HostWeightTier::offloaded(const Tensor& on_host) {
  return on_host;
}

}  // namespace kiln
