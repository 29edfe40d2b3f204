// Which recorded op calls a fused elementwise kernel can replace, and how each becomes nodes of an
// ElementwiseRegion. The rules mirror the unfused CPU kernels (src/backends/cpu/elementwise.cpp): float32
// math on float32/bfloat16/float16 operands, one rounding to the output dtype, scalars as run-time arguments.
#pragma once

#include <vector>

#include "graph/elementwise_region.h"
#include "runtime/op_call.h"

namespace kiln::graph {

// True when `call` is an elementwise op with a fused equivalent whose operands are all 16/32-bit floats and
// whose single output is contiguous (unary math, add/sub/mul/div/maximum/minimum with a tensor or a scalar,
// clamp, and "copy" as a dtype cast).
bool is_fusable(const runtime::OpCall& call);

// Adds `call`'s computation to `region`, reading its tensor operands from `args` (one value per input of
// the call, in order), and appends the scalars it needs to `scalars`. Returns the value of its output.
ValueId add_to_region(ElementwiseRegion& region, const runtime::OpCall& call,
                      const std::vector<ValueId>& args, std::vector<double>& scalars);

}  // namespace kiln::graph
