// Deferred-and-fused's and compiled mode's module: a whole region of op calls on one device
// (runtime/device_region.h) as ONE StableHLO module, each call lowered in order over values (op_lowering.h),
// so XLA sees the chain and fuses it, and only the storages the region must store come back as buffers.
//
// Parameters, in order of first use: the array (as op_module.h has them) of every storage the region reads
// before writing it, and of every storage it writes only partly (a narrow(), a strided view) before writing
// it whole — its old elements are kept; and every elementwise op's scalar (HloBuilder::lift_scalars), a
// rank-0 array passed at each launch, so a step size or sigma that changes every denoising step does not
// change the text. Results: the final array of each storage marked stored (of whole_storage_dims when last
// written whole), in order of first write. A storage written whole and read back through the same view passes
// its value straight on (no store, no load). Like op_module's, the text depends only on the calls' structure,
// shapes, dtypes, views and attributes, so it keys the executable caches: every flush (or block) of the same
// structure reuses one executable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/pjrt/stablehlo/lowering_target.h"
#include "backends/pjrt/stablehlo/storage_views.h"
#include "kiln/core/dtype.h"
#include "runtime/device_region.h"

namespace kiln::pjrt::hlo {

struct RegionModule {
  // A storage named by one of the region's operands: calls[call].inputs[operand] or .outputs[operand].
  struct Operand {
    int64_t call = 0;
    bool output = false;
    int64_t operand = 0;
  };
  struct Param {
    Operand source;       // the storage whose current buffer is passed (for an output: zeros if none yet)
    DType dtype;          // the array's dtype (or the scalar's)
    Shape dims;           // the array's dims ({} for a scalar)
    bool scalar = false;  // a lifted scalar: `value` as a rank-0 array of `dtype`, not a storage
    double value = 0;
  };
  std::string text;
  std::vector<Param> params;     // @main's parameters, in order
  std::vector<Operand> results;  // @main's results: each names the stored storage it replaces (an output)
};

// Lowered for `target` (the device's platform), each storage read as an array of `array_dims` (flat when
// not given). Throws a kiln::Error naming the call when an op has no
// lowering, a storage is read as another dtype than the region wrote it in, or a view reaches past its
// storage.
RegionModule region_module(const runtime::DeviceRegion& region, const LoweringTarget& target = {},
                           const ArrayDims& array_dims = flat_array_dims);

}  // namespace kiln::pjrt::hlo
