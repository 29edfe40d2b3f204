// all_reduce_sum and all_gather on a PJRT device, for tensor parallelism with one process per device (MPI
// ranks, each on its own device, as on the CPU): the input is read back to the host, the host collective runs
// over MPI (dist/host_collectives.h: the same bits as the CPU kernels), and the result goes back to the
// device. Collectives inside one module across the devices of one client (all_reduce in StableHLO) are not
// built yet.
#pragma once

#include "kiln/core/device.h"

namespace kiln::runtime {
class KernelRegistry;
}

namespace kiln::pjrt {

void register_collective_kernels(runtime::KernelRegistry& registry, DeviceType type);

}  // namespace kiln::pjrt
