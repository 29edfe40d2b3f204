// What an execution context (kiln/runtime/execution_context.h) may hold in memory, and how its weights come
// and go. Offloading (kiln/pipelines/offload.h) is made of these settings; each context has its own, so two
// pipelines in one process can run under different budgets.
//
//  - Packed copies. linear and conv2d keep a weight reordered into the layout their kernels prefer, on the
//    weight's Storage (faster matmuls). Such a copy is anonymous memory the OS cannot reclaim, while a weight
//    read in place from a memory-mapped checkpoint lives in the page cache, which it can. Past the packed
//    budget, linear reads a weight in place (0-12% slower on bf16 matmuls, cpu-limits.md section 2) and
//    conv2d reorders it per call. Copies already made stay until their weight is freed; lowering the budget
//    only affects later packing.
//  - Prepacking: whether linear uses a packed copy at all, per weight dtype (WeightPrepacking).
//  - Resident mapped weights. Beyond this budget, the least recently read weights that live in memory-mapped
//    checkpoint files leave the process (Storage::drop_resident_pages): they stay in the page cache, so the
//    next read maps them back without a disk read. With it (and no packed copies) the resident set follows
//    the budget, not the model: sequential offload on a host without an accelerator. One weight is always
//    kept.
//  - Weight groups: group offload's blocks (kiln/runtime/weight_groups.h).
//
// Kernels never read these settings: the runtime reports what each kernel reads when it launches it
// (note_reads), and a backend that wants to keep a packed copy asks for a charge (reserve_packed).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/runtime/device_ledger.h"
#include "kiln/runtime/weight_groups.h"

namespace kiln {

// Whether linear keeps a packed copy of a weight (float16 weights always get a packed float32 copy:
// converting them on every call would cost more than the product).
//  Auto (default): bfloat16 weights are packed (10-13% faster than the stored [N, K] layout on this CPU,
//    and bf16 weights are usually memory-mapped file pages the kernel can drop, so the copy is the only
//    resident one); float32 weights are used in place (packing gains 1-4% and f32 weights are usually
//    owned converted copies, so packing would double their resident memory).
//  Always / Never: for all dtypes. The environment variable KILN_PREPACK_WEIGHTS=auto|1|0 sets the initial
//  policy of every context.
enum class WeightPrepacking { Auto, Always, Never };

namespace runtime {
class PackedWeightCharge;
}

class MemoryPolicy {
 public:
  MemoryPolicy();
  ~MemoryPolicy();
  MemoryPolicy(const MemoryPolicy&) = delete;
  MemoryPolicy& operator=(const MemoryPolicy&) = delete;

  // The most bytes of packed weight copies (std::nullopt: no limit, the default).
  void set_packed_weight_budget(std::optional<int64_t> bytes);
  std::optional<int64_t> packed_weight_budget() const;
  // Bytes the packed copies made under this policy hold now.
  int64_t packed_weight_bytes() const;

  void set_weight_prepacking(WeightPrepacking policy);
  WeightPrepacking weight_prepacking() const;
  // Whether, under the policy, linear uses a packed copy of a weight of this dtype (linear and linear_fused
  // apply the same rule, so both find one packed copy of a weight).
  bool weight_is_prepacked(DType weight_dtype) const;

  // The most bytes of weights read in place from memory-mapped checkpoints kept resident (std::nullopt: no
  // limit, the default; setting it forgets what was counted).
  void set_resident_weight_budget(std::optional<int64_t> bytes);
  std::optional<int64_t> resident_weight_budget() const;

  // Group offload (kiln/runtime/weight_groups.h): replaces the registered groups (none: off).
  void set_weight_groups(std::vector<WeightGroup> groups, bool prefetch);
  void clear_weight_groups();
  // Stops any prefetch in flight and forgets which group is current (the groups stay registered).
  void stop_weight_prefetch();
  WeightGroupStats weight_group_stats() const;

  // ---- for the runtime and the backends
  // The registered weight group `storage` belongs to (-1: none, or group offload off), and a number that
  // changes whenever the groups are registered again. A device region never spans two groups
  // (graph/graph_plan.h), so that group offload streams the groups through compiled programs too.
  int weight_group_of(const Storage& storage) const;
  uint64_t weight_groups_generation() const;
  // Just before a kernel runs, on the thread that runs it: the tensors it reads. Group offload switches
  // groups when a weight of another group is read; the resident budget counts mapped weights.
  void note_reads(const std::vector<Tensor>& inputs);
  // A backend about to keep a packed copy of `bytes`: a charge, held as long as the copy, when they fit in
  // what the packed budget has left; an empty charge when they do not.
  runtime::PackedWeightCharge reserve_packed(int64_t bytes);
  // The ledger of what this policy's context holds on `device` (kiln/runtime/device_ledger.h), made on first
  // use (`made` then set) with `owner` as its name. Use current_device_ledger().
  std::shared_ptr<DeviceLedger> device_ledger(Device device, const std::string& owner, bool& made);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The same settings on the calling thread's current context (kiln/runtime/execution_context.h): outside any
// ExecutionScope, the process's default context.
void set_packed_weight_budget(std::optional<int64_t> bytes);
std::optional<int64_t> packed_weight_budget();
int64_t packed_weight_bytes();
void set_weight_prepacking(WeightPrepacking policy);
WeightPrepacking weight_prepacking();
bool weight_is_prepacked(DType weight_dtype);
void set_resident_weight_budget(std::optional<int64_t> bytes);
std::optional<int64_t> resident_weight_budget();

}  // namespace kiln
