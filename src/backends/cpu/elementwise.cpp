#include "backends/cpu/register_kernels.h"

namespace kiln::cpu_kernels {

void register_elementwise_kernels(runtime::KernelRegistry& registry) {}

}  // namespace kiln::cpu_kernels
