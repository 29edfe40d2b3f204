#include "runtime/dispatcher.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backends/cpu/register_kernels.h"
#include "kiln/core/device_runtime.h"
#include "kiln/runtime/eager_mode.h"
#include "runtime/counter_updates.h"
#include "runtime/exit_hook.h"

namespace kiln::runtime {

namespace {
struct KernelEntry {
  Kernel kernel = nullptr;
  // Set by the first launch; see exit_hook.h for why the first one matters.
  std::atomic<bool> launched{false};
};
struct RegistryTable {
  std::map<std::pair<std::string, DeviceType>, KernelEntry, std::less<>> kernels;
};
RegistryTable& table() {
  static RegistryTable t;
  return t;
}
KernelEntry* find_entry(std::string_view op, DeviceType device) {
  auto& k = table().kernels;
  auto it = k.find(std::pair<std::string, DeviceType>{std::string(op), device});
  return it == k.end() ? nullptr : &it->second;
}
}  // namespace

void KernelRegistry::add(std::string_view op, DeviceType device, Kernel kernel) {
  table().kernels[{std::string(op), device}].kernel = kernel;
}

Kernel KernelRegistry::find(std::string_view op, DeviceType device) const {
  const KernelEntry* e = find_entry(op, device);
  return e ? e->kernel : nullptr;
}

KernelRegistry& kernel_registry() {
  static KernelRegistry registry;
  static std::once_flag once;
  std::call_once(once, [] { cpu_kernels::register_kernels(registry); });
  return registry;
}

std::string OpCall::describe() const {
  std::string s(op);
  s += "(";
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i) s += ", ";
    s += inputs[i].defined() ? std::string(dtype_name(inputs[i].dtype())) + shape_str(inputs[i].shape())
                             : "None";
  }
  s += ")";
  if (!outputs.empty()) {
    s += " -> ";
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (i) s += ", ";
      s += std::string(dtype_name(outputs[i].dtype())) + shape_str(outputs[i].shape());
    }
  }
  return s;
}

void dispatch(OpCall call) {
  const EagerMode mode = eager_mode();
  const Tensor& anchor = !call.outputs.empty() ? call.outputs.front() : call.inputs.front();
  const Device device = anchor.device();
  kernel_registry();  // registers the built-in kernels on first use
  KernelEntry* entry = find_entry(call.op, device.type);
  KILN_CHECK(entry != nullptr && entry->kernel != nullptr,
             call.op << ": no kernel for device " << device.str());
  Stream& stream = device_runtime(device).stream();
  count_op_dispatched();
  auto shared = std::make_shared<OpCall>(std::move(call));
  stream.enqueue(
      [shared, entry] {
        count_kernel_launched();
        // Re-arm the exit hook after (never before) a kernel's first run, also when it throws.
        struct ArmAfter {
          bool first;
          ~ArmAfter() {
            if (first) arm_exit_hook();
          }
        } arm_after{!entry->launched.load(std::memory_order_relaxed) && !entry->launched.exchange(true)};
        entry->kernel(*shared);
      },
      [shared] { return shared->describe(); });
  if (mode == EagerMode::DeferNeverLaunchBlocking) stream.synchronize();
}

}  // namespace kiln::runtime
