// CPU scaled-dot-product attention, reachable without the dispatcher so that tests can run both ISA variants
// in one process.
#pragma once

#include "kiln/core/tensor.h"

namespace kiln::cpu_kernels {

// Queries per tile and keys per online-softmax step (a multiple of 16). Defaults measured at S = 1536,
// 24 heads x 128, bf16, one core (CPU-time rate against a VDPBF16PS ceiling measured alongside, the host
// being shared): 64 x 128 keys 75-76%, 64 x 256 77-79%, 48-96 x 512 78-80%, 48 x 1024 78-79%. Longer key
// tiles amortise each step (rescaling the accumulator, the products' prologues); the scores, probabilities
// and accumulator of a 64 x 512 tile (~290 KiB) stay in L2. Tests use small tiles to cross many tile edges.
struct AttentionTiling {
  int64_t query_tile = 64;
  int64_t key_tile = 512;
};

// out [B, H, Sq, Dv] = attention(q [B, H, Sq, D], k [B, H, Skv, D], v [B, H, Skv, Dv]) with an optional bias
// already expanded to [B, H, Sq, Skv] (undefined: none). All tensors have unit stride in the last dim (or
// stride 0 for a broadcast bias column); the front end (src/ops/attention.cpp) has checked shapes and
// dtypes. `avx512` picks the tile kernel variant.
// (The front end's kernel runs the default tiling.)
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                       const Tensor& out, double scale, bool causal, bool avx512,
                       const AttentionTiling& tiling = {});

}  // namespace kiln::cpu_kernels
