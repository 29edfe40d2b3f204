// The deferred graph of EagerMode::DeferAndFuse, one per execution context (runtime/context_state.h;
// implemented by graph/lazy_graph.cpp). dispatch() hands each op call to the current context's graph instead
// of its stream; the recorded calls are optimised (dead code, common subexpressions, fusion:
// graph/graph_plan.h) and launched when something needs their values:
//   - a host read (Tensor::data/to_vector/item) of a tensor it computes, an op run eagerly (or in another
//     context) that reads one, or synchronize();
//   - a repeating block: when the newest recorded ops repeat the block of ops just before them (as the
//     blocks of a transformer and the steps of a denoising loop do), so every flush sees the same structure
//     and reuses the same fused kernels;
//   - a size cap (kMaxDeferredOps), which bounds what a flush has to analyse.
#pragma once

#include <cstddef>

namespace kiln::runtime {

inline constexpr size_t kMaxDeferredOps = 4096;

// Optimises and launches everything the current context has recorded, in order; does nothing when nothing
// is recorded. Errors raised while optimising or compiling name the op concerned; kernel errors surface at
// the stream's next synchronisation as in strict eager.
void flush_deferred();

// Ops the current context has recorded and not yet flushed.
size_t deferred_op_count();

}  // namespace kiln::runtime
