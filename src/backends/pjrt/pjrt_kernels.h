// The PJRT backend's kernels: every op with a StableHLO lowering (backends/pjrt/stablehlo/op_lowering.h) runs
// as its own executable (strict eager), and "copy" also moves bytes between the host and a device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/pjrt/pjrt_backend.h"
#include "kiln/core/tensor.h"

namespace kiln::runtime {
class KernelRegistry;
struct OpCall;
}  // namespace kiln::runtime

namespace kiln::pjrt {

void register_pjrt_kernels(runtime::KernelRegistry& registry, DeviceType type);

// Runs `call` (every operand on one PJRT device) as its own executable: compiled once per distinct module
// text, its outputs' storages replaced by the buffers it returns.
void run_op_module(const runtime::OpCall& call);

// The buffer `t`'s storage holds, checked to be written and of t's dtype; `what` names the reader in errors.
std::shared_ptr<Buffer> written_buffer(const Tensor& t, const std::string& what);
// A lifted scalar (hlo::HloBuilder::lift_scalars): `value` as a rank-0 array of `dtype` on `device`.
std::shared_ptr<Buffer> scalar_buffer(double value, DType dtype, const DeviceHandle& device);
// What `t`'s storage holds before an op writes part of it: its buffer, or zeros when nothing wrote it yet.
std::shared_ptr<Buffer> buffer_before(const Tensor& t, const DeviceHandle& device, const std::string& what);

// Runs the 1 x 1 `executable` on `device` (its handle `handle`), waits for it on the stream's worker, so that
// a failure is reported as `what`'s (the caller is not held up), and stores its buffers in the storages of
// `results`, in order. The results are counted on the device before it runs and its scratch while it runs
// (memory_stats' peak shows both; --max-memory refuses a run they do not fit); running out, by that limit or
// by the plugin's allocator, is fail_out_of_memory's error naming `what`.
void execute_into(Device device, const DeviceHandle& handle, const Executable& executable,
                  const std::vector<std::shared_ptr<Buffer>>& arguments,
                  const std::vector<const Tensor*>& results, const std::string& what);

}  // namespace kiln::pjrt
