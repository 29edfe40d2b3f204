#include "graph/fused_launch.h"

#include "runtime/kernel_work.h"

namespace kiln::graph {

namespace {

class FusedWork final : public runtime::KernelWork {
 public:
  FusedWork(std::shared_ptr<const FusedKernel> kernel, std::shared_ptr<const ElementwiseRegion> region,
            std::vector<double> scalars, std::vector<Tensor> inputs, std::vector<Tensor> outputs,
            std::function<std::string()> describe)
      : kernel_(std::move(kernel)),
        region_(std::move(region)),
        scalars_(std::move(scalars)),
        inputs_(std::move(inputs)),
        outputs_(std::move(outputs)),
        describe_(std::move(describe)) {}

  const std::vector<Tensor>& reads() const override { return inputs_; }
  const std::vector<Tensor>& writes() const override { return outputs_; }
  void run() override { CpuJit::invoke(*kernel_, *region_, inputs_, scalars_, outputs_); }
  std::string describe() const override { return describe_(); }
  bool fused() const override { return true; }

 private:
  std::shared_ptr<const FusedKernel> kernel_;
  std::shared_ptr<const ElementwiseRegion> region_;
  std::vector<double> scalars_;
  std::vector<Tensor> inputs_, outputs_;
  std::function<std::string()> describe_;
};

}  // namespace

void launch_fused(std::shared_ptr<const FusedKernel> kernel, std::shared_ptr<const ElementwiseRegion> region,
                  std::vector<double> scalars, std::vector<Tensor> inputs, std::vector<Tensor> outputs,
                  std::function<std::string()> describe) {
  const Device device = outputs.front().device();
  runtime::enqueue_work(
      device, std::make_shared<FusedWork>(std::move(kernel), std::move(region), std::move(scalars),
                                          std::move(inputs), std::move(outputs), std::move(describe)));
}

}  // namespace kiln::graph
