#include "backends/cpu/fused_kernels.h"
#include "backends/cpu/register_kernels.h"

namespace kiln::cpu_kernels {

void register_fused_kernels(runtime::KernelRegistry& registry) {
  registry.add("linear_fused", DeviceType::CPU, linear_fused_kernel);
  registry.add("norm_modulate", DeviceType::CPU, norm_modulate_kernel);
}

}  // namespace kiln::cpu_kernels
