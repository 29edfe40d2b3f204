#include "runtime/dispatcher.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kiln/runtime/eager_mode.h"
#include "kiln/runtime/execution_context.h"
#include "runtime/backend.h"
#include "runtime/capture.h"
#include "runtime/context_state.h"
#include "runtime/counter_updates.h"
#include "runtime/kernel_work.h"
#include "runtime/op_table.h"

namespace kiln::runtime {

namespace {

struct RegistryTable {
  std::map<std::pair<std::string, DeviceType>, Kernel, std::less<>> kernels;
};
RegistryTable& table() {
  static RegistryTable t;
  return t;
}

// An op call as a stream's work: its operands are what the kernel reads and writes.
class OpCallWork final : public KernelWork {
 public:
  OpCallWork(OpCall call, Kernel kernel) : call_(std::move(call)), kernel_(kernel) {}
  const std::vector<Tensor>& reads() const override { return call_.inputs; }
  const std::vector<Tensor>& writes() const override { return call_.outputs; }
  void run() override { kernel_(call_); }
  std::string describe() const override { return call_.describe(); }

 private:
  OpCall call_;
  Kernel kernel_;
};

// The device whose backend runs `call`: its operands' one device. A copy between devices is the one op whose
// operands may differ: the device side's backend moves the bytes (a host<->device transfer), as in torch.
Device device_of(const OpCall& call) {
  const Tensor& anchor = !call.outputs.empty() ? call.outputs.front() : call.inputs.front();
  const Device device = anchor.device();
  for (const std::vector<Tensor>* operands : {&call.inputs, &call.outputs}) {
    for (const Tensor& t : *operands) {
      if (!t.defined() || t.device() == device) continue;
      KILN_CHECK(call.op == "copy", call.op << ": operands on " << device.str() << " and " << t.device().str()
                                            << "; move them to one device first (Tensor::to)");
      if (device.type == DeviceType::CPU) return t.device();
    }
  }
  return device;
}

Kernel kernel_for(const OpCall& call, Device device) {
  Kernel kernel = kernel_registry().find(call.op, device.type);
  if (kernel == nullptr) {
    KILN_FAIL(call.op << " is not supported on " << device.str() << " (the "
                      << backend_for(device.type).name() << " backend has no kernel for it)");
  }
  return kernel;
}

}  // namespace

void KernelRegistry::add(std::string_view op, DeviceType device, Kernel kernel) {
  KILN_CHECK(find_op(op) != nullptr,
             "internal: a kernel for op '" << op << "', which runtime/op_table.cpp lacks");
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
  std::call_once(once, [] {
    for (Backend* backend : backends()) backend->register_kernels(registry);
  });
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
  const Device device = device_of(call);
  Kernel kernel = kernel_for(call, device);
  enqueue_work(device, std::make_shared<OpCallWork>(std::move(call), kernel));
}

void enqueue_work(Device device, std::shared_ptr<KernelWork> work) {
  ExecutionContext& context = current_context();
  ContextState& state = context.state();
  const std::shared_ptr<Stream> stream = state.stream(device);
  const std::shared_ptr<DeferredGraph> own_graph = state.existing_deferred_graph();
  for (const Tensor& t : work->reads()) {
    if (!t.defined()) continue;
    const std::shared_ptr<PendingWork> pending = t.storage()->pending_write();
    if (pending == nullptr || pending == stream) continue;  // done, or queued before this on the same stream
    if (pending == own_graph)
      own_graph->flush();  // recorded before a mode change and not run yet: it runs first, on this stream
    else
      pending->wait();  // another context's work
  }
  for (const Tensor& t : work->writes())
    if (t.defined()) t.storage()->set_pending_write(stream);
  count_bytes_moved(operand_bytes(work->reads(), work->writes()));
  stream->enqueue(
      [work, &context] {
        ExecutionScope in(context);
        // Ops a kernel dispatches internally run at once, whatever mode recorded the kernel's own call.
        EagerModeGuard eager(EagerMode::DeferNever);
        context.memory().note_reads(work->reads());
        count_kernel_launched();
        if (work->fused()) count_fused_kernel_launched();
        work->run();
      },
      [work] { return work->describe(); });
}

void dispatch(OpCall call) {
  const Device device = device_of(call);
  kernel_for(call, device);  // an op the device's backend lacks fails here, at the call that asked for it
  if (std::vector<OpCall>* capture = capture_target()) {
    capture->push_back(std::move(call));
    return;
  }
  const EagerMode mode = eager_mode();
  count_op_dispatched();
  ExecutionContext& context = current_context();
  if (mode == EagerMode::DeferAndFuse) {
    context.state().deferred_graph(context).record(std::move(call));
    return;
  }
  launch(std::move(call));
  if (mode == EagerMode::DeferNeverLaunchBlocking) context.synchronize(device);
}

}  // namespace kiln::runtime
