// Chains of recorded op calls that one fused op (kiln/ops/fused.h) computes in a single pass:
//   linear -> [gelu | gelu_tanh | silu] -> [mul by a gate] -> [add a residual]   =>  linear_fused
//     (at least one of the three; FLUX/SD3 MLPs, gated attention outputs and gated residuals)
//   layer_norm/rms_norm without affine -> mul by (1 + scale) -> add shift          =>  norm_modulate
//     (adaLN modulation, with 1 + scale recognised as add(1.0, scale))
// A chain is replaced only when its intermediates are private to it (made by the chain, read once by the next
// link, unseen outside the graph) and none of its inputs is overwritten while it runs. The replacement is
// expressed through the fused op's own front end (captured, not run) and writes the chain's final tensor.
// Numerics: the fused ops round once where the chain rounds after every op (see kiln/ops/fused.h).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/op_call.h"

namespace kiln::graph {

// Returns the calls with every matched chain replaced; `rewritten` (optional) counts the chains.
std::vector<runtime::OpCall> rewrite_fused_patterns(std::vector<runtime::OpCall> calls,
                                                    const std::vector<const Storage*>& keep,
                                                    int64_t* rewritten);

}  // namespace kiln::graph
