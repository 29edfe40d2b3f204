// The CPU device: an aligned allocator with byte counters and an in-order stream whose tasks run on a
// worker thread (kernels parallelise inside it with OpenMP).
#include <cstdlib>

#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"
#include "runtime/worker_stream.h"

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

class CpuRuntime final : public DeviceRuntime {
 public:
  explicit CpuRuntime(Device device) : device_(device) {}
  Device device() const override { return device_; }
  Allocator& allocator() override { return allocator_; }
  Stream& stream() override { return stream_; }

 private:
  Device device_;
  CpuAllocator allocator_;
  runtime::WorkerStream stream_;
};

}  // namespace

DeviceRuntime& device_runtime(Device device) {
  KILN_CHECK(device.type == DeviceType::CPU,
             "device " << device.str() << " is not available: this build of Kiln has the cpu backend only");
  KILN_CHECK(device.index == 0, "device " << device.str() << " does not exist: the cpu device is cpu:0");
  // Never destroyed: tensors held by other statics free their storage through this allocator during exit,
  // in whatever order those statics go; the stream's worker is stopped by the exit hook instead.
  static CpuRuntime* runtime = new CpuRuntime(cpu);
  return *runtime;
}

}  // namespace kiln
