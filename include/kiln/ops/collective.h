// Collectives over the tensor-parallel process group (kiln/dist/process_group.h), as ordinary ops: dispatched
// like any other op, so strict eager runs them on the device stream (in order, asynchronously), the
// deferred mode records them as graph nodes and compiled programs contain them as nodes.
// Each call carries a unique sequence number among its attributes, so the graph passes never merge two
// collectives as duplicates; the device stream keeps their order, which is the same on every rank.
//
// Sums are taken in rank order in float32 (rounded once to the dtype), so every rank gets the same bits and
// the result does not depend on MPI's reduction algorithm. Without a process group (one process) both are
// the identity.
#pragma once

#include <cstdint>

#include "kiln/core/tensor.h"

namespace kiln {

// The elementwise sum of `x` over the ranks (float32, bfloat16 or float16); same shape and dtype.
Tensor all_reduce_sum(const Tensor& x);

// Concatenation of every rank's `x` along `dim` in rank order: the size of `dim` grows world_size() times.
Tensor all_gather(const Tensor& x, int64_t dim);

}  // namespace kiln
