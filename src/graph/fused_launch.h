// Queuing a fused elementwise kernel (built by the CPU JIT for an ElementwiseRegion) on the current execution
// context's stream, as one kernel launch (runtime/kernel_work.h): what a deferred graph's flush and a
// compiled program's run do for each fused region.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graph/cpu_jit.h"
#include "graph/elementwise_region.h"

namespace kiln::graph {

// `describe` names the kernel in errors.
void launch_fused(std::shared_ptr<const FusedKernel> kernel, std::shared_ptr<const ElementwiseRegion> region,
                  std::vector<double> scalars, std::vector<Tensor> inputs, std::vector<Tensor> outputs,
                  std::function<std::string()> describe);

}  // namespace kiln::graph
