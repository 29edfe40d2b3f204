// A compiled forward (compiled mode, kiln/nn/compile.h): the op calls of one traced forward for fixed input
// shapes, optimised like a lazy-graph flush (graph/graph_plan.h: duplicates, dead code, fused chains, fused
// elementwise kernels), with a static memory plan: every intermediate the plan still stores gets a fixed
// offset in one arena, reused by intermediates whose lifetimes do not overlap; outputs get their own memory.
//
// On a device whose backend compiles regions (runtime::Backend::joins_region: PJRT devices), the planned
// calls become device regions (graph/graph_plan.h): a forward whose calls are all on one such device is one
// region, run as one program per run; its intermediates get no memory at all (storages on such a device are
// written only by what the region stores), and the per-shape program is the backend's per-module-text
// executable, so every block of the same shapes shares it.
//
// Tracing captures the ops (runtime/capture.h) instead of running them. Tensors the forward reads are bound
// by role: the forward's inputs and the module's parameters are rebound at every run (so one program serves
// every instance of a repeated block), anything else it reads (tables made on the host from shapes alone) is
// kept as a constant. Reading tensor values on the host inside the forward breaks the graph and fails the
// trace, naming the op whose result was read.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graph/cpu_jit.h"
#include "graph/elementwise_region.h"
#include "runtime/op_call.h"

namespace kiln::graph {

// Where a traced tensor lives when the program runs.
struct ValueRef {
  enum class Kind : uint8_t { Undefined, Input, Param, Constant, Buffer };
  Kind kind = Kind::Undefined;
  int32_t index = -1;  // input, parameter, constant or buffer number
  int64_t offset = 0;  // elements from the start of that input/parameter view, or of the buffer
  Shape shape;
  Strides strides;
  DType dtype = float32;
};

// One call of a device region, its operands as references.
struct RegionCallRef {
  std::string_view op;
  runtime::Attrs attrs;
  bool may_merge = true;
  std::vector<ValueRef> inputs, outputs;
};

struct ProgramStep {
  // A device region (region_calls non-empty): its calls, and which of their outputs it stores
  // (runtime::DeviceRegion::stored).
  std::vector<RegionCallRef> region_calls;
  std::vector<std::vector<bool>> region_stored;
  // A kernel call (kernel == nullptr): op, operands and attributes as recorded.
  std::string_view op;
  runtime::Attrs attrs;
  // A fused elementwise kernel (kernel != nullptr): its region and scalars.
  std::shared_ptr<const FusedKernel> kernel;
  std::shared_ptr<const ElementwiseRegion> region;
  std::vector<double> scalars;
  std::string description;  // for errors and logs
  std::vector<ValueRef> inputs, outputs;
};

struct ProgramStats {
  int64_t traced_calls = 0;     // op calls the forward made
  int64_t steps = 0;            // kernels one run launches
  int64_t fused_kernels = 0;    // of which fused elementwise kernels
  int64_t chains_fused = 0;     // linear/norm chains replaced by fused ops
  int64_t regions = 0;          // of steps, device regions (one program each)
  int64_t arena_bytes = 0;      // the intermediates' arena
  int64_t peak_live_bytes = 0;  // the most intermediate bytes alive at once (a lower bound for the arena)
  int64_t unplanned_bytes = 0;  // what the same intermediates would take without reuse
};

class Program {
 public:
  using Forward = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

  // Traces `forward(inputs)` with `params` (the module's parameters) bound by role, and builds the program.
  // Inputs must be contiguous (undefined ones are allowed and stay undefined). Throws kiln::Error when the
  // forward breaks the graph (a host read), naming the op.
  static std::shared_ptr<Program> trace(const std::vector<Tensor>& inputs, const std::vector<Tensor>& params,
                                        const Forward& forward);

  // Runs on new inputs and parameters of the traced shapes and dtypes (contiguous); returns the outputs.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs, const std::vector<Tensor>& params) const;

  const ProgramStats& stats() const { return stats_; }

 private:
  struct Buffer {
    size_t bytes = 0;
    int64_t arena_offset = -1;  // bytes into the arena; -1 for outputs and device storages (made per run)
    Device device = cpu;
  };

  std::vector<ProgramStep> steps_;
  std::vector<Tensor> constants_;
  std::vector<Buffer> buffers_;
  std::vector<ValueRef> outputs_;
  std::vector<Shape> input_shapes_;
  std::vector<Shape> param_shapes_;
  ProgramStats stats_;
};

}  // namespace kiln::graph
