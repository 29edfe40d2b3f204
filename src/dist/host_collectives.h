// The collectives' arithmetic on host memory, shared by every backend's kernels: the CPU's run it on the
// tensors' own bytes, a PJRT device's on bytes staged through the host. Each is one MPI all-gather of the
// contiguous input (transport.h), then a sum in rank order or a reassembly along the gathered dimension.
// Gathering then summing locally (rather than MPI_Allreduce) gives every rank the same bits whatever MPI's
// algorithm, and handles bfloat16, which MPI has no type for; for the 2-8 ranks of tensor parallelism the
// bytes moved are of the same order.
#pragma once

#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"

namespace kiln::dist {

struct LocalRank;

// out = the sum over ranks of every rank's `in` (`numel` elements of `dtype`: float32, bfloat16 or float16,
// accumulated in float32 in rank order). `in` and `out` may be the same memory. `local`: the ranks are the
// threads of that in-process group (dist/local_group.h) and exchange through host memory; null: the MPI
// process group.
void all_reduce_sum_host(const void* in, DType dtype, int64_t numel, void* out,
                         const LocalRank* local = nullptr);

// out = every rank's `in` (a dense array of `shape`) concatenated along `dim` in rank order. `in` and `out`
// may overlap.
void all_gather_host(const void* in, const Shape& shape, size_t element_size, int64_t dim, void* out,
                     const LocalRank* local = nullptr);

}  // namespace kiln::dist
