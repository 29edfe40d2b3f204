// The PJRT backend's kernels: every op with a StableHLO lowering (backends/pjrt/stablehlo/op_lowering.h) runs
// as its own executable (strict eager), and "copy" also moves bytes between the host and a device.
#pragma once

#include "kiln/core/device.h"

namespace kiln::runtime {
class KernelRegistry;
struct OpCall;
}  // namespace kiln::runtime

namespace kiln::pjrt {

void register_pjrt_kernels(runtime::KernelRegistry& registry, DeviceType type);

// Runs `call` (every operand on one PJRT device) as its own executable: compiled once per distinct module
// text, its outputs' storages replaced by the buffers it returns.
void run_op_module(const runtime::OpCall& call);

}  // namespace kiln::pjrt
