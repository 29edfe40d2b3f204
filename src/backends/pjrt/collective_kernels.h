// all_reduce_sum and all_gather on a PJRT device. Two kinds of ranks:
//  - in-process ranks (kiln/dist/local_ranks.h), one per device of one client: the ranks meet, and one
//    executable compiled for one replica per rank's device (stablehlo/collective_module.h) runs the
//    collective between the devices; nothing goes through the host;
//  - MPI ranks (one process per device, as on the CPU): the input is read back to the host, the host
//    collective runs over MPI (dist/host_collectives.h: the same bits as the CPU kernels), and the result
//    goes back to the device.
#pragma once

#include "kiln/core/device.h"

namespace kiln::runtime {
class KernelRegistry;
}

namespace kiln::pjrt {

void register_collective_kernels(runtime::KernelRegistry& registry, DeviceType type);

}  // namespace kiln::pjrt
