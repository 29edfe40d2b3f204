#include "backends/pjrt/pjrt_kernels.h"

#include <cstring>
#include <vector>

#include "backends/pjrt/collective_kernels.h"
#include "backends/pjrt/device_array.h"
#include "backends/pjrt/device_memory.h"
#include "backends/pjrt/executable_cache.h"
#include "backends/pjrt/host_transfer.h"
#include "backends/pjrt/pjrt_backend.h"
#include "backends/pjrt/stablehlo/op_lowering.h"
#include "backends/pjrt/stablehlo/op_module.h"
#include "runtime/dispatcher.h"
#include "runtime/op_table.h"

namespace kiln::pjrt {

std::shared_ptr<Buffer> written_buffer(const Tensor& t, const std::string& what) {
  std::shared_ptr<Buffer> b = device_array(t).buffer();
  KILN_CHECK(b != nullptr,
             what << " reads " << t.str() << ", which no op has written (made by Tensor::empty)");
  KILN_CHECK(b->dtype() == t.dtype(),
             what << " reads " << t.str() << " from storage written as " << dtype_name(b->dtype())
                  << ": reinterpreting a storage's bytes as another dtype is not supported on PJRT devices");
  return b;
}

std::shared_ptr<Buffer> scalar_buffer(double value, DType dtype, const DeviceHandle& device) {
  return visit_dtype(dtype, [&](auto tag) {
    const auto v = scalar_from_double<decltype(tag)>(value);
    return device.client->buffer_from_host(&v, sizeof v, dtype, {}, device.local_index);
  });
}

std::shared_ptr<Buffer> buffer_before(const Tensor& t, const DeviceHandle& device, const std::string& what) {
  if (std::shared_ptr<Buffer> b = device_array(t).buffer()) return written_buffer(t, what);
  std::vector<char> zeros(t.storage()->bytes(), 0);
  return device.client->buffer_from_host(zeros.data(), zeros.size(), t.dtype(), held_array_dims(t),
                                         device.local_index);
}

void execute_into(Device device, const DeviceHandle& handle, const Executable& executable,
                  const std::vector<std::shared_ptr<Buffer>>& arguments,
                  const std::vector<const Tensor*>& results, const std::string& what) {
  // The results' arrays first: they are counted on the device before it runs.
  size_t result_bytes = 0;
  std::vector<DeviceArray*> arrays;
  for (const Tensor* t : results) {
    result_bytes += t->storage()->bytes();
    arrays.push_back(&device_array(*t));
  }
  const size_t scratch = static_cast<size_t>(executable.scratch_bytes().value_or(0));
  const TransientCharge held(device_memory(device), scratch, "the scratch of " + what);
  std::vector<std::shared_ptr<Buffer>> buffers =
      explain_out_of_memory(device, result_bytes + scratch, what, [&] {
        std::vector<std::shared_ptr<Buffer>> r =
            handle.client->execute_on(executable, arguments, handle.local_index);
        for (const auto& b : r) b->await_ready();
        return r;
      });
  KILN_CHECK(buffers.size() == arrays.size(), "internal: the executable of "
                                                  << what << " returned " << buffers.size() << " buffers for "
                                                  << arrays.size() << " results");
  for (size_t i = 0; i < buffers.size(); ++i) arrays[i]->set(std::move(buffers[i]));
}

void run_op_module(const runtime::OpCall& call) {
  const DeviceHandle device = device_handle(call.outputs.front().device());
  const hlo::OpModule module =
      hlo::op_module(call, hlo::lowering_target(device.client->platform_name()), held_array_dims);
  const std::string what = call.describe();
  const std::shared_ptr<Executable> executable = cached_executable(
      *device.client, module.text, what, {},
      [&call](const hlo::LoweringTarget& t) { return hlo::op_module(call, t, held_array_dims).text; });
  std::vector<std::shared_ptr<Buffer>> arguments;
  for (const hlo::OpModule::Param& p : module.params) {
    switch (p.source) {
      case hlo::OpModule::Source::Input:
        arguments.push_back(written_buffer(call.inputs[p.index], std::string(call.op)));
        break;
      case hlo::OpModule::Source::OutputBefore:
        arguments.push_back(buffer_before(call.outputs[p.index], device, std::string(call.op)));
        break;
      case hlo::OpModule::Source::Scalar:
        arguments.push_back(scalar_buffer(p.value, p.dtype, device));
        break;
    }
  }
  std::vector<const Tensor*> outputs;
  for (const Tensor& t : call.outputs) outputs.push_back(&t);
  execute_into(call.outputs.front().device(), device, *executable, arguments, outputs, what);
}

namespace {

void op_kernel(const runtime::OpCall& call) {
  run_op_module(call);
}

void copy_kernel(const runtime::OpCall& call) {
  const Tensor& src = call.inputs.front();
  const Tensor& dst = call.outputs.front();
  const bool src_on_host = src.device().type == DeviceType::CPU;
  const bool dst_on_host = dst.device().type == DeviceType::CPU;
  if (!src_on_host && !dst_on_host && src.device() == dst.device()) return run_op_module(call);
  if (src_on_host) return copy_host_to_device(src, dst);
  if (dst_on_host) return copy_device_to_host(src, dst);
  copy_device_to_host_to_device(src, dst);
}

}  // namespace

void register_pjrt_kernels(runtime::KernelRegistry& registry, DeviceType type) {
  for (const runtime::OpInfo& op : runtime::op_table()) {
    if (op.name == "copy")
      registry.add(op.name, type, copy_kernel);
    else if (hlo::has_lowering(op.name))
      registry.add(op.name, type, op_kernel);
  }
  register_collective_kernels(registry, type);
}

}  // namespace kiln::pjrt
