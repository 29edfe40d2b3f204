// Strict eager's module: one OpCall as a whole StableHLO module whose parameters and results are device
// storages' arrays (see storage_views.h), so the runtime passes each input's storage buffer as it is and
// replaces each output's storage buffer by the matching result.
//
// Parameters, in order: one per defined call.inputs[i] (its whole storage as an array of the input's dtype
// and the dims `array_dims` gives; an undefined input has none), then, for each output that does not cover
// its whole storage contiguously from offset 0 (a narrow() or a strided view: concat's pieces, copy_ into a
// slice), that output's storage before the call, so the elements outside the view are kept. Last, each
// elementwise scalar (an op's "scalar" attr) as a rank-0 parameter (HloBuilder::lift_scalars), so
// `mul(x, dt)` compiles once whatever dt is. Results: one array per output (the whole storage, the output's
// dtype): of whole_storage_dims when the output covers its storage, else of the dims of the array before.
// `params` records which is which.
//
// The text depends only on the op, its attrs (but not the scalar), its tensors' shapes, strides, offsets,
// dtypes and storage sizes and the dims of their arrays, never on addresses, so it is deterministic and
// serves as the compile-cache key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/pjrt/stablehlo/lowering_target.h"
#include "backends/pjrt/stablehlo/storage_views.h"
#include "kiln/core/dtype.h"
#include "runtime/op_call.h"

namespace kiln::pjrt::hlo {

struct OpModule {
  enum class Source {
    Input,         // call.inputs[index]'s storage
    OutputBefore,  // call.outputs[index]'s storage as it is before the call
    Scalar,        // `value`, a rank-0 array of `dtype`
  };
  struct Param {
    Source source;
    int64_t index;     // into call.inputs or call.outputs (-1 for a scalar)
    DType dtype;       // the array's dtype (the tensor's), or the scalar's
    Shape dims;        // the array's dims ({} for a scalar)
    double value = 0;  // a scalar's value, already rounded as the lowering computes with it
  };
  struct Result {
    DType dtype;
    Shape dims;
  };
  std::string text;             // the module (MLIR text, generic StableHLO)
  std::vector<Param> params;    // @main's parameters, in order
  std::vector<Result> results;  // @main's results: call.outputs[i]'s new storage, in order
};

// Lowered for `target` (the device's platform), each storage read as an array of `array_dims` (flat when
// not given). Throws a kiln::Error naming the op when it has no lowering (has_lowering) or a view reaches
// past its storage.
OpModule op_module(const runtime::OpCall& call, const LoweringTarget& target = {},
                   const ArrayDims& array_dims = flat_array_dims);

}  // namespace kiln::pjrt::hlo
