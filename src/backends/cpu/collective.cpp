// "all_reduce_sum" and "all_gather" on CPU: the host collectives (dist/host_collectives.h) on the tensors'
// own bytes (the front end makes the input contiguous), among the MPI process group or the in-process ranks
// the call names.
#include "backends/cpu/register_kernels.h"
#include "dist/host_collectives.h"
#include "dist/local_group.h"

namespace kiln::cpu_kernels {

namespace {

void all_reduce_sum_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  const std::optional<dist::LocalRank> local = dist::local_rank_of(call.attrs);
  dist::all_reduce_sum_host(x.raw_data(), x.dtype(), x.numel(), call.outputs[0].raw_data(),
                            local ? &*local : nullptr);
}

void all_gather_kernel(const runtime::OpCall& call) {
  const Tensor& x = call.inputs[0];
  const std::optional<dist::LocalRank> local = dist::local_rank_of(call.attrs);
  dist::all_gather_host(x.raw_data(), x.shape(), x.element_size(), call.attrs.get_int("dim"),
                        call.outputs[0].raw_data(), local ? &*local : nullptr);
}

}  // namespace

void register_collective_kernels(runtime::KernelRegistry& registry) {
  registry.add("all_reduce_sum", DeviceType::CPU, all_reduce_sum_kernel);
  registry.add("all_gather", DeviceType::CPU, all_gather_kernel);
}

}  // namespace kiln::cpu_kernels
