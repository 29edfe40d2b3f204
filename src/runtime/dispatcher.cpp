#include "runtime/dispatcher.h"

#include <map>
#include <mutex>
#include <string>

#include "backends/cpu/register_kernels.h"
#include "graph/cpu_jit.h"
#include "kiln/core/device_runtime.h"
#include "kiln/runtime/eager_mode.h"
#include "runtime/capture.h"
#include "runtime/counter_updates.h"
#include "runtime/deferred.h"

namespace kiln::runtime {

namespace {
struct RegistryTable {
  std::map<std::pair<std::string, DeviceType>, Kernel, std::less<>> kernels;
};
RegistryTable& table() {
  static RegistryTable t;
  return t;
}
}  // namespace

void KernelRegistry::add(std::string_view op, DeviceType device, Kernel kernel) {
  table().kernels[{std::string(op), device}] = kernel;
}

Kernel KernelRegistry::find(std::string_view op, DeviceType device) const {
  auto& k = table().kernels;
  auto it = k.find(std::pair<std::string, DeviceType>{std::string(op), device});
  return it == k.end() ? nullptr : it->second;
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

void launch(OpCall call) {
  const Tensor& anchor = !call.outputs.empty() ? call.outputs.front() : call.inputs.front();
  const Device device = anchor.device();
  Kernel kernel = kernel_registry().find(call.op, device.type);
  KILN_CHECK(kernel != nullptr, call.op << ": no kernel for device " << device.str());
  count_bytes_moved(operand_bytes(call.inputs, call.outputs));
  auto shared = std::make_shared<OpCall>(std::move(call));
  device_runtime(device).stream().enqueue(
      [shared, kernel] {
        // Ops a kernel dispatches internally run at once, whatever mode recorded the kernel's own call.
        EagerModeGuard eager(EagerMode::DeferNever);
        count_kernel_launched();
        kernel(*shared);
      },
      [shared] { return shared->describe(); });
}

void launch_fused(std::shared_ptr<const graph::FusedKernel> kernel,
                  std::shared_ptr<const graph::ElementwiseRegion> region, std::vector<double> scalars,
                  std::vector<Tensor> inputs, std::vector<Tensor> outputs,
                  std::function<std::string()> describe) {
  count_bytes_moved(operand_bytes(inputs, outputs));
  const Device device = outputs.front().device();
  device_runtime(device).stream().enqueue(
      [kernel = std::move(kernel), region = std::move(region), scalars = std::move(scalars),
       inputs = std::move(inputs), outputs = std::move(outputs)] {
        EagerModeGuard eager(EagerMode::DeferNever);
        count_kernel_launched();
        count_fused_kernel_launched();
        graph::CpuJit::invoke(*kernel, *region, inputs, scalars, outputs);
      },
      std::move(describe));
}

namespace {
thread_local std::vector<OpCall>* t_capture = nullptr;
}  // namespace

CaptureGuard::CaptureGuard(std::vector<OpCall>* into) : previous_(t_capture) {
  t_capture = into;
}
CaptureGuard::~CaptureGuard() {
  t_capture = previous_;
}
std::vector<OpCall>* capture_target() {
  return t_capture;
}

void check_host_read(const Tensor& t) {
  if (t_capture == nullptr) return;
  std::string made_by = "a tensor the traced code did not compute";
  for (auto it = t_capture->rbegin(); it != t_capture->rend(); ++it)
    for (const Tensor& o : it->outputs)
      if (o.defined() && o.storage() == t.storage()) {
        made_by = "the result of " + it->describe();
        it = std::prev(t_capture->rend());
        break;
      }
  KILN_FAIL(
      "the traced forward reads tensor values on the host ("
      << made_by
      << "), which breaks the graph: ops are being recorded, not run; compute it with ops, or move the read "
         "out of the compiled forward");
}

void dispatch(OpCall call) {
  const Tensor& anchor = !call.outputs.empty() ? call.outputs.front() : call.inputs.front();
  KILN_CHECK(kernel_registry().find(call.op, anchor.device().type) != nullptr,
             call.op << ": no kernel for device " << anchor.device().str());
  if (t_capture != nullptr) {
    t_capture->push_back(std::move(call));
    return;
  }
  const EagerMode mode = eager_mode();
  count_op_dispatched();
  if (mode == EagerMode::DeferAndFuse) {
    defer(std::move(call));
    return;
  }
  const Device device = anchor.device();
  launch(std::move(call));
  if (mode == EagerMode::DeferNeverLaunchBlocking) device_runtime(device).stream().synchronize();
}

}  // namespace kiln::runtime
