// Queuing a device region (runtime/device_region.h) on the current execution context's stream as ONE kernel
// launch (runtime/kernel_work.h), run by its device's backend (runtime::Backend::run_region): what a deferred
// graph's flush and a compiled program's run do for each region the plan made.
#pragma once

#include <memory>

#include "runtime/device_region.h"

namespace kiln::graph {

void launch_region(std::shared_ptr<const runtime::DeviceRegion> region);

}  // namespace kiln::graph
