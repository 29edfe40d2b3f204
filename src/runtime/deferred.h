// The lazy graph of EagerMode::DeferAndFuse. dispatch() hands each op call here instead of to a stream; the
// recorded calls are optimised (dead code, common subexpressions, fusion: graph/lazy_graph.h) and launched
// when something needs their values:
//   - a host read (Tensor::data/to_vector/item) or synchronize(), which call flush_deferred();
//   - a repeating block: when the newest recorded ops repeat the block of ops just before them (as the
//     blocks of a transformer and the steps of a denoising loop do), so every flush sees the same structure
//     and reuses the same fused kernels;
//   - a size cap (kMaxDeferredOps), which bounds what a flush has to analyse.
// One graph per process, guarded by a mutex: tensors recorded by one thread may be read by another.
#pragma once

#include <cstddef>

#include "runtime/op_call.h"

namespace kiln::runtime {

inline constexpr size_t kMaxDeferredOps = 4096;

// Records `call` (already checked by its op front end and by dispatch()).
void defer(OpCall call);

// Optimises and launches everything recorded so far, in order; does nothing when nothing is recorded.
// Errors raised while optimising or compiling name the op concerned; kernel errors surface at the stream's
// next synchronisation as in strict eager.
void flush_deferred();

// Ops recorded and not yet flushed.
size_t deferred_op_count();

}  // namespace kiln::runtime
