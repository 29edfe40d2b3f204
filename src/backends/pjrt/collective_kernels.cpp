#include "backends/pjrt/collective_kernels.h"

#include "backends/pjrt/host_transfer.h"
#include "dist/host_collectives.h"
#include "runtime/dispatcher.h"

namespace kiln::pjrt {

namespace {

// The input's values in host memory (dense), for the host collective to read and write in place.
Tensor staged_on_host(const Tensor& x) {
  Tensor host = Tensor::empty(x.shape(), x.dtype(), cpu);
  copy_device_to_host(x, host);
  return host;
}

void all_reduce_sum_kernel(const runtime::OpCall& call) {
  const Tensor host = staged_on_host(call.inputs[0]);
  dist::all_reduce_sum_host(host.raw_data(), host.dtype(), host.numel(), host.raw_data());
  copy_host_to_device(host, call.outputs[0]);
}

void all_gather_kernel(const runtime::OpCall& call) {
  const Tensor host = staged_on_host(call.inputs[0]);
  const Tensor& out = call.outputs[0];
  Tensor gathered = Tensor::empty(out.shape(), out.dtype(), cpu);
  dist::all_gather_host(host.raw_data(), host.shape(), host.element_size(), call.attrs.get_int("dim"),
                        gathered.raw_data());
  copy_host_to_device(gathered, out);
}

}  // namespace

void register_collective_kernels(runtime::KernelRegistry& registry, DeviceType type) {
  registry.add("all_reduce_sum", type, all_reduce_sum_kernel);
  registry.add("all_gather", type, all_gather_kernel);
}

}  // namespace kiln::pjrt
