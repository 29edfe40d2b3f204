// The CPU backend: the caching allocator (cpu_allocator.h), in-order streams whose tasks run on a worker
// thread each (runtime/worker_stream.h; kernels parallelise inside it with OpenMP), and Kiln's own kernels.
#include "backends/cpu/cpu_runtime.h"

#include <memory>
#include <string>

#include "backends/cpu/cpu_allocator.h"
#include "backends/cpu/cpu_features.h"
#include "backends/cpu/host_weight_tier.h"
#include "backends/cpu/register_kernels.h"
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

class CpuBackend final : public runtime::Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  std::vector<DeviceType> device_types() const override { return {DeviceType::CPU}; }
  DeviceRuntime& runtime(Device device) override {
    KILN_CHECK(device.index == 0, "device " << device.str() << " does not exist: the cpu device is cpu:0");
    // Never destroyed: tensors held by other statics free their storage through this allocator during exit,
    // in whatever order those statics go; the streams' workers are stopped by the exit hook instead.
    static CpuRuntime* runtime = new CpuRuntime(cpu);
    return *runtime;
  }
  void register_kernels(runtime::KernelRegistry& registry) override {
    cpu_kernels::register_kernels(registry);
  }
  std::vector<DeviceDescription> devices(DeviceType) override {
    const cpu_kernels::CpuFeatures& f = cpu_kernels::cpu_features();
    std::string what = std::string("Kiln's kernels, ") + cpu_kernels::cpu_isa_name();
    if (f.avx512_bf16) what += ", avx512_bf16";
    if (f.amx_bf16) what += ", amx_bf16";
    return {{cpu, "cpu", what}};
  }
};

}  // namespace

runtime::Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace kiln
