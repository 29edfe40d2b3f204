// A backend: what drives one or more device types — its runtime per device (allocator, streams, weight tier),
// its kernels, and the devices it can reach. Backends are registered objects
// (src/backends/builtin_backends.cpp lists the ones built in), so the runtime and the graph passes include
// none of them: a new backend implements this interface, registers a kernel for each op it supports, and
// touches nothing else.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/dtype.h"
#include "kiln/runtime/devices.h"
#include "runtime/device_region.h"

namespace kiln::runtime {

class KernelRegistry;

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu", "pjrt": how errors and `kiln info --devices` name it.
  virtual std::string_view name() const = 0;
  virtual std::vector<DeviceType> device_types() const = 0;
  // The runtime of `device`, made on first use; throws kiln::Error naming the device and what is missing (no
  // such index, no plugin installed).
  virtual DeviceRuntime& runtime(Device device) = 0;
  // Adds a kernel for every (op, device type) this backend supports: an op without one on a device is refused
  // by name when dispatched there, never run elsewhere.
  virtual void register_kernels(KernelRegistry& registry) = 0;
  // The devices of `type` reachable now; throws kiln::Error saying why none is (for `kiln info --devices`).
  virtual std::vector<DeviceDescription> devices(DeviceType type) = 0;

  // Optional: a backend that compiles a whole region of calls into one program (runtime/device_region.h).
  // Whether `call` may join a region on its device; false (the default) leaves it to the graph passes' own
  // plan (the CPU's: fused elementwise kernels from the CPU JIT, every other call launched alone).
  virtual bool joins_region(const OpCall&) const { return false; }
  // Runs `region` (calls that joins_region accepted, all on one device); called on that device's stream,
  // once per launch. Only called when joins_region accepted every call.
  virtual void run_region(const DeviceRegion& region);
  // Whether scaled_dot_product_attention of `head_dim` in `dtype` runs on `type` as one fused kernel that
  // never holds the scores (a memory budget's activation estimate then leaves them out); false by default.
  virtual bool fuses_attention(DeviceType, DType, int64_t /*head_dim*/) const { return false; }
  // The keys per block when scaled_dot_product_attention (without a bias) of `head_dim` in `dtype` runs on
  // `type` as a loop over key blocks, holding one block's scores at a time; 0 (the default) when it holds
  // them all, or none (fused).
  virtual int64_t attention_key_block(DeviceType, DType, int64_t /*head_dim*/) const { return 0; }
};

// The backends built into this library, filled on first use (register_builtin_backends).
const std::vector<Backend*>& backends();
// The backend driving `type`; throws kiln::Error when this build has none.
Backend& backend_for(DeviceType type);

// Defined by src/backends/builtin_backends.cpp: appends the built-in backends.
void register_builtin_backends(std::vector<Backend*>& into);

}  // namespace kiln::runtime
