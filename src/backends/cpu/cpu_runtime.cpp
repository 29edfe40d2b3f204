// The CPU device: an aligned allocator with byte counters and an in-order stream.
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>

#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"

namespace kiln {

namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    // 64-byte alignment: one cache line, one AVX-512 vector. Round the size up as aligned_alloc requires.
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = rounded == 0 ? nullptr : std::aligned_alloc(64, rounded);
    KILN_CHECK(rounded == 0 || p != nullptr, "cpu: out of memory allocating " << bytes << " bytes ("
                                                                              << stats().current_bytes
                                                                              << " bytes already in use)");
    record_allocate(bytes);
    return p;
  }
  void deallocate(void* ptr, size_t bytes) override {
    std::free(ptr);
    record_deallocate(bytes);
  }
};

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
