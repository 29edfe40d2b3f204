// The CPU device: an aligned allocator with byte counters and an in-order stream.
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>

#include "backends/cpu/cpu_allocator.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"

namespace kiln {

namespace {

// Runs each task when it is enqueued, in order, on the calling thread; kernels parallelise inside.
class InlineStream final : public Stream {
 public:
  void enqueue(std::function<void()> task, std::function<std::string()> describe) override {
    try {
      task();
    } catch (const Error& e) {
      throw Error(describe() + ": " + e.what());
    } catch (const std::exception& e) {
      throw Error(describe() + " failed: " + e.what());
    }
  }
  void synchronize() override {}
};

class CpuRuntime final : public DeviceRuntime {
 public:
  explicit CpuRuntime(Device device) : device_(device) {}
  Device device() const override { return device_; }
  Allocator& allocator() override { return allocator_; }
  Stream& stream() override { return stream_; }

 private:
  Device device_;
  CpuAllocator allocator_;
  InlineStream stream_;
};

}  // namespace

DeviceRuntime& device_runtime(Device device) {
  KILN_CHECK(device.type == DeviceType::CPU,
             "device " << device.str() << " is not available: this build of Kiln has the cpu backend only");
  KILN_CHECK(device.index == 0, "device " << device.str() << " does not exist: the cpu device is cpu:0");
  static CpuRuntime runtime(cpu);
  return runtime;
}

}  // namespace kiln
