#include "graph/region_launch.h"

#include <unordered_set>

#include "runtime/backend.h"
#include "runtime/kernel_work.h"

namespace kiln::graph {

namespace {

class RegionWork final : public runtime::KernelWork {
 public:
  explicit RegionWork(std::shared_ptr<const runtime::DeviceRegion> region) : region_(std::move(region)) {
    // The stream must wait only for what the region reads from before it: values it makes itself are
    // neither waited for nor (when not stored) ever written.
    std::unordered_set<const Storage*> made;
    for (const runtime::OpCall& c : region_->calls) {
      for (const Tensor& t : c.inputs)
        if (t.defined() && !made.count(t.storage().get())) reads_.push_back(t);
      for (const Tensor& t : c.outputs)
        if (t.defined()) made.insert(t.storage().get());
    }
    for (size_t i = 0; i < region_->calls.size(); ++i)
      for (size_t o = 0; o < region_->calls[i].outputs.size(); ++o)
        if (region_->stored[i][o]) writes_.push_back(region_->calls[i].outputs[o]);
  }

  const std::vector<Tensor>& reads() const override { return reads_; }
  const std::vector<Tensor>& writes() const override { return writes_; }
  void run() override { runtime::backend_for(region_->device().type).run_region(*region_); }
  std::string describe() const override { return region_->describe(); }
  bool fused() const override { return true; }

 private:
  std::shared_ptr<const runtime::DeviceRegion> region_;
  std::vector<Tensor> reads_, writes_;
};

}  // namespace

void launch_region(std::shared_ptr<const runtime::DeviceRegion> region) {
  const Device device = region->device();
  runtime::enqueue_work(device, std::make_shared<RegionWork>(std::move(region)));
}

}  // namespace kiln::graph
