// The kernels of the backends built into this library. Declared here and defined by the backends
// (src/backends/builtin_kernels.cpp), so that the runtime fills its kernel registry without including any
// backend: a new backend adds its registration there and touches nothing in the runtime.
#pragma once

namespace kiln::runtime {

class KernelRegistry;

void register_builtin_kernels(KernelRegistry& registry);

}  // namespace kiln::runtime
