#include "backends/pjrt/collective_kernels.h"

#include <any>
#include <sstream>

#include "backends/pjrt/device_array.h"
#include "backends/pjrt/executable_cache.h"
#include "backends/pjrt/host_transfer.h"
#include "backends/pjrt/pjrt_backend.h"
#include "backends/pjrt/pjrt_kernels.h"
#include "backends/pjrt/stablehlo/collective_module.h"
#include "dist/host_collectives.h"
#include "dist/local_group.h"
#include "runtime/dispatcher.h"

namespace kiln::pjrt {

namespace {

// ---- in-process ranks: one executable across the ranks' devices

// What each rank brings to the rendezvous.
struct Contribution {
  DeviceHandle device;
  Device kiln_device;
  std::shared_ptr<Buffer> input;
  std::string module;  // the same text on every rank when they agree on the call
  std::string what;
};

std::vector<std::any> run_across_devices(const std::vector<std::any>& items) {
  std::vector<Contribution> ranks;
  for (const std::any& item : items) ranks.push_back(std::any_cast<const Contribution&>(item));
  const Contribution& first = ranks.front();
  std::vector<int> devices;
  std::vector<std::vector<std::shared_ptr<Buffer>>> arguments;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const Contribution& c = ranks[r];
    KILN_CHECK(c.device.client == first.device.client,
               c.what << ": in-process ranks must be on devices of one PJRT client; rank 0 is on "
                      << first.kiln_device.str() << ", rank " << r << " on " << c.kiln_device.str());
    for (size_t q = 0; q < r; ++q)
      KILN_CHECK(ranks[q].device.local_index != c.device.local_index,
                 c.what << ": ranks " << q << " and " << r << " are both on " << c.kiln_device.str()
                        << "; in-process ranks need a device each");
    KILN_CHECK(c.module == first.module, c.what << ": rank " << r << " made a different call (" << c.what
                                                << ") than rank 0 (" << first.what
                                                << "); every rank must make the same collectives in order");
    devices.push_back(c.device.local_index);
    arguments.push_back({c.input});
  }
  std::ostringstream what;
  what << first.what << " across " << ranks.size() << " in-process ranks";
  const std::shared_ptr<Executable> executable =
      cached_executable(*first.device.client, first.module, what.str(), devices);
  std::vector<std::vector<std::shared_ptr<Buffer>>> outputs =
      first.device.client->execute(*executable, arguments);
  std::vector<std::any> results;
  for (auto& per_device : outputs) results.emplace_back(std::move(per_device.at(0)));
  return results;
}

void run_in_process(const runtime::OpCall& call, const dist::LocalRank& local) {
  const Tensor& in = call.inputs[0];
  DeviceArray& output = device_array(call.outputs[0]);  // taken first: counted on the device before it runs
  Contribution mine{device_handle(in.device()), in.device(), written_buffer(in, std::string(call.op)),
                    hlo::collective_module(call, local.group->size(), held_array_dims), call.describe()};
  const std::any result = local.group->rendezvous(local.rank, std::move(mine), run_across_devices);
  auto out = std::any_cast<std::shared_ptr<Buffer>>(result);
  // Waiting here, on this rank's stream, reports a failure as this op's.
  out->await_ready();
  output.set(std::move(out));
}

// ---- MPI ranks: staged through the host

// The input's values in host memory (dense), for the host collective to read and write in place.
Tensor staged_on_host(const Tensor& x) {
  Tensor host = Tensor::empty(x.shape(), x.dtype(), cpu);
  copy_device_to_host(x, host);
  return host;
}

void all_reduce_sum_kernel(const runtime::OpCall& call) {
  if (const std::optional<dist::LocalRank> local = dist::local_rank_of(call.attrs))
    return run_in_process(call, *local);
  const Tensor host = staged_on_host(call.inputs[0]);
  dist::all_reduce_sum_host(host.raw_data(), host.dtype(), host.numel(), host.raw_data());
  copy_host_to_device(host, call.outputs[0]);
}

void all_gather_kernel(const runtime::OpCall& call) {
  if (const std::optional<dist::LocalRank> local = dist::local_rank_of(call.attrs))
    return run_in_process(call, *local);
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
