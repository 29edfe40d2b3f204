// The backends built into this library, registered with the runtime (runtime/builtin_kernels.h).
#include "runtime/builtin_kernels.h"
#include "backends/cpu/register_kernels.h"

namespace kiln::runtime {

void register_builtin_kernels(KernelRegistry& registry) {
  cpu_kernels::register_kernels(registry);
}

}  // namespace kiln::runtime
