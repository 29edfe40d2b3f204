// CPU scaled-dot-product attention, reachable without the dispatcher so that tests can run both ISA variants
// in one process.
#pragma once

#include "kiln/core/tensor.h"

namespace kiln::cpu_kernels {

// out [B, H, Sq, Dv] = attention(q [B, H, Sq, D], k [B, H, Skv, D], v [B, H, Skv, Dv]) with an optional bias
// already expanded to [B, H, Sq, Skv] (undefined: none). All tensors have unit stride in the last dim (or
// stride 0 for a broadcast bias column); the front end (src/ops/attention.cpp) has checked shapes and
// dtypes. `avx512` picks the tile kernel variant.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                       const Tensor& out, double scale, bool causal, bool avx512);

}  // namespace kiln::cpu_kernels
