// "all_reduce_sum" and "all_gather" on CPU: the host collectives (dist/host_collectives.h) on the tensors'
// own bytes (the front end makes the input contiguous).
#include "backends/cpu/register_kernels.h"
#include "dist/host_collectives.h"

namespace kiln::cpu_kernels {

namespace {

void all_reduce_sum_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  dist::all_reduce_sum_host(x.raw_data(), x.dtype(), x.numel(), call.outputs[0].raw_data());
}

void all_gather_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  dist::all_gather_host(x.raw_data(), x.shape(), x.element_size(), call.attrs.get_int("dim"),
                        call.outputs[0].raw_data());
}

}  // namespace

void register_collective_kernels(runtime::KernelRegistry& registry) {
  registry.add("all_reduce_sum", DeviceType::CPU, all_reduce_sum_kernel);
  registry.add("all_gather", DeviceType::CPU, all_gather_kernel);
}

}  // namespace kiln::cpu_kernels
