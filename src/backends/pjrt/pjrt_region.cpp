#include "backends/pjrt/pjrt_region.h"

#include "backends/pjrt/device_array.h"
#include "backends/pjrt/executable_cache.h"
#include "backends/pjrt/pjrt_backend.h"
#include "backends/pjrt/pjrt_kernels.h"
#include "backends/pjrt/stablehlo/op_lowering.h"
#include "backends/pjrt/stablehlo/region_module.h"

namespace kiln::pjrt {

namespace {

const Tensor& operand(const runtime::DeviceRegion& region, const hlo::RegionModule::Operand& o) {
  const runtime::OpCall& call = region.calls[static_cast<size_t>(o.call)];
  return o.output ? call.outputs[static_cast<size_t>(o.operand)]
                  : call.inputs[static_cast<size_t>(o.operand)];
}

}  // namespace

bool joins_pjrt_region(const runtime::OpCall& call) {
  if (call.outputs.empty() || !hlo::has_lowering(call.op)) return false;
  const Device device = call.outputs.front().device();
  if (device.type == DeviceType::CPU) return false;
  for (const std::vector<Tensor>* operands : {&call.inputs, &call.outputs})
    for (const Tensor& t : *operands)
      if (t.defined() && t.device() != device) return false;
  return true;
}

void run_pjrt_region(const runtime::DeviceRegion& region) {
  const DeviceHandle device = device_handle(region.device());
  const hlo::RegionModule module =
      hlo::region_module(region, hlo::lowering_target(device.client->platform_name()), held_array_dims);
  const std::string what = region.describe();
  const std::shared_ptr<Executable> executable =
      cached_executable(*device.client, module.text, what, {}, [&region](const hlo::LoweringTarget& t) {
        return hlo::region_module(region, t, held_array_dims).text;
      });
  std::vector<std::shared_ptr<Buffer>> arguments;
  for (const hlo::RegionModule::Param& p : module.params) {
    if (p.scalar) {
      arguments.push_back(scalar_buffer(p.value, p.dtype, device));
      continue;
    }
    const Tensor& t = operand(region, p.source);
    arguments.push_back(p.source.output ? buffer_before(t, device, what) : written_buffer(t, what));
  }
  std::vector<const Tensor*> results;
  for (const hlo::RegionModule::Operand& r : module.results) results.push_back(&operand(region, r));
  execute_into(region.device(), device, *executable, arguments, results, what);
}

}  // namespace kiln::pjrt
