// The CPU device: the caching allocator (cpu_allocator.h) and in-order streams whose tasks run on a worker
// thread each (runtime/worker_stream.h; kernels parallelise inside it with OpenMP).
#include <cstdlib>
#include <memory>

#include "backends/cpu/cpu_allocator.h"
#include "backends/cpu/host_weight_tier.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"
#include "runtime/worker_stream.h"

namespace kiln {

namespace {

class CpuRuntime final : public DeviceRuntime {
 public:
  explicit CpuRuntime(Device device) : device_(device) {}
  Device device() const override { return device_; }
  Allocator& allocator() override { return allocator_; }
  std::shared_ptr<Stream> create_stream() override { return std::make_shared<runtime::WorkerStream>(); }
  WeightTier& weight_tier() override { return weight_tier_; }

 private:
  Device device_;
  CpuAllocator allocator_;
  HostWeightTier weight_tier_;
};

}  // namespace

DeviceRuntime& device_runtime(Device device) {
  KILN_CHECK(device.type == DeviceType::CPU,
             "device " << device.str() << " is not available: this build of Kiln has the cpu backend only");
  KILN_CHECK(device.index == 0, "device " << device.str() << " does not exist: the cpu device is cpu:0");
  // Never destroyed: tensors held by other statics free their storage through this allocator during exit,
  // in whatever order those statics go; the streams' workers are stopped by the exit hook instead.
  static CpuRuntime* runtime = new CpuRuntime(cpu);
  return *runtime;
}

}  // namespace kiln
