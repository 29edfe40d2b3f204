#include "backends/pjrt/pjrt_backend.h"

#include <map>
#include <mutex>
#include <string>

#include "backends/pjrt/client_options.h"
#include "backends/pjrt/device_memory.h"
#include "backends/pjrt/offloaded_weight.h"
#include "backends/pjrt/pjrt_kernels.h"
#include "backends/pjrt/pjrt_region.h"
#include "backends/pjrt/plugin_locator.h"
#include "backends/pjrt/stablehlo/lowering_target.h"
#include "backends/pjrt/tpu_host.h"
#include "kiln/core/error.h"
#include "runtime/worker_stream.h"

namespace kiln::pjrt {

namespace {

class PjrtDeviceRuntime final : public DeviceRuntime {
 public:
  PjrtDeviceRuntime(Device device, DeviceHandle handle)
      : device_(device), handle_(std::move(handle)), memory_(device), tier_(device) {}
  Device device() const override { return device_; }
  Allocator& allocator() override { return memory_; }
  // Ops are issued from a worker thread, so the caller never waits for a compile or a launch (PJRT's own
  // execution is asynchronous too).
  std::shared_ptr<Stream> create_stream() override { return std::make_shared<runtime::WorkerStream>(); }
  WeightTier& weight_tier() override { return tier_; }
  const DeviceHandle& handle() const { return handle_; }

 private:
  Device device_;
  DeviceHandle handle_;
  DeviceMemory memory_;
  OffloadedWeightTier tier_;
};

std::string_view plugin_kind(DeviceType type) {
  return device_type_name(type);
}

class PjrtBackend final : public runtime::Backend {
 public:
  std::string_view name() const override { return "pjrt"; }
  std::vector<DeviceType> device_types() const override {
    return {DeviceType::CUDA, DeviceType::TPU, DeviceType::XlaCpu};
  }

  DeviceRuntime& runtime(Device device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = runtimes_.find({device.type, device.index});
    if (it != runtimes_.end()) return *it->second;
    const std::shared_ptr<Client> c = client_locked(device.type);
    const int count = static_cast<int>(c->devices().size());
    KILN_CHECK(device.index < count, "device " << device.str() << " does not exist: the "
                                               << device_type_name(device.type) << " plugin ("
                                               << c->plugin_path() << ") has " << count << " device"
                                               << (count == 1 ? "" : "s"));
    // Never destroyed, like the CPU runtime: storages held by statics free through it during exit.
    auto* made = new PjrtDeviceRuntime(device, DeviceHandle{c, device.index});
    runtimes_.emplace(std::make_pair(device.type, device.index), made);
    return *made;
  }

  void register_kernels(runtime::KernelRegistry& registry) override {
    for (DeviceType type : device_types()) register_pjrt_kernels(registry, type);
  }

  std::vector<DeviceDescription> devices(DeviceType type) override {
    std::shared_ptr<Client> c;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      c = client_locked(type);
    }
    // "NVIDIA H200 (cuda 12.8, PJRT API 0.116, /path/xla_cuda_plugin.so)"; the CPU plugin's kind, platform
    // and version are all "cpu", said once.
    std::string platform = c->platform_name();
    if (const std::string version = c->platform_version(); !version.empty() && version != platform)
      platform += " " + version;
    std::vector<DeviceDescription> out;
    for (const DeviceInfo& info : c->devices()) {
      const std::string what = info.kind == platform ? "" : info.kind + " ";
      out.push_back(
          {Device(type, info.local_index), "pjrt",
           what + "(" + platform + ", PJRT API " + c->api_version() + ", " + c->plugin_path() + ")"});
    }
    return out;
  }

  // Deferred-and-fused flushes and compiled forwards run as one executable per region.
  bool joins_region(const runtime::OpCall& call) const override { return joins_pjrt_region(call); }
  void run_region(const runtime::DeviceRegion& region) override { run_pjrt_region(region); }

  // The attention lowering's own rule (stablehlo/lowering_target.h), asked without loading the plugin.
  bool fuses_attention(DeviceType type, DType dtype, int64_t head_dim) const override {
    return hlo::lowering_target(plugin_kind(type)).cudnn_attention &&
           hlo::cudnn_attention_takes(dtype, head_dim);
  }
  int64_t attention_key_block(DeviceType type, DType dtype, int64_t head_dim) const override {
    return hlo::attention_key_block(plugin_kind(type), dtype, head_dim);
  }

  DeviceHandle handle(Device device) { return static_cast<PjrtDeviceRuntime&>(runtime(device)).handle(); }

 private:
  std::shared_ptr<Client> client_locked(DeviceType type) {
    auto it = clients_.find(type);
    if (it != clients_.end()) return it->second;
    // A failure is not remembered: installing the plugin and asking again works in the same process.
    require_pjrt_support();
    const std::string plugin = find_plugin(plugin_kind(type));
    if (type == DeviceType::TPU) require_tpu_chips(plugin);
    std::shared_ptr<Client> c = Client::create(plugin, client_options(type));
    // KILN_PJRT_PLUGIN names one plugin for every kind: make sure it drives the kind asked for.
    const std::string platform = c->platform_name();
    const std::string_view expected = type == DeviceType::XlaCpu ? "cpu" : device_type_name(type);
    KILN_CHECK(platform == expected, "device type " << device_type_name(type) << " needs a " << expected
                                                    << " PJRT plugin, but " << c->plugin_path() << " drives '"
                                                    << platform << "' devices");
    clients_.emplace(type, c);
    return c;
  }

  std::mutex mutex_;
  std::map<DeviceType, std::shared_ptr<Client>> clients_;
  std::map<std::pair<DeviceType, int>, PjrtDeviceRuntime*> runtimes_;
};

PjrtBackend& backend() {
  static PjrtBackend* b = new PjrtBackend;
  return *b;
}

}  // namespace

runtime::Backend& pjrt_backend() {
  return backend();
}

DeviceHandle device_handle(Device device) {
  return backend().handle(device);
}

}  // namespace kiln::pjrt
