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
// Where the products are fast next to reading the packed K and V once per query tile (2.4 MB per head at
// S = 4608, more than L2), twice the queries per tile halve that reading. Measured on an Intel Xeon with AMX
// (2 threads, bf16): on AMX tiles (24 heads x 128, GFLOP/s) S = 4608, 64 x 512 1089, 128 x 256 1119,
// 128 x 512 1139, 256 x 512 1055; S = 1536, 64 x 512 1047, 128 x 512 1084. On the fma32 path (ms, two
// rounds) S = 4608 x 24 x 128: 64 x 512 1008, 128 x 512 926; S = 4429 x 48 x 64: 932-959 -> 892-927;
// S = 1536: 104 -> 98-106.
inline constexpr AttentionTiling kWideTiling{128, 512};

// Which tile kernels run: the portable ones, the AVX-512 ones, or the AVX-512 ones with bf16 products on
// AMX tiles (bf16 inputs; needs amx_usable(); float32 inputs run as with Avx512).
enum class AttnKernel { Generic, Avx512, Amx };
const char* attn_kernel_name(AttnKernel kernel);

// out [B, H, Sq, Dv] = attention(q [B, H, Sq, D], k [B, H, Skv, D], v [B, H, Skv, Dv]) with an optional bias
// already expanded to [B, H, Sq, Skv] (undefined: none). All tensors have unit stride in the last dim (or
// stride 0 for a broadcast bias column); the front end (src/ops/attention.cpp) has checked shapes and
// dtypes. bf16 inputs multiply as bf16 pairs, or widened to float32 where bf16_path() is fma32 (and the
// kernel is not Amx). The front end's kernel runs default_attn_kernel() with default_attn_tiling().
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                       const Tensor& out, double scale, bool causal, AttnKernel kernel,
                       const AttentionTiling& tiling = {});

// The kernel for a product of `dtype` on this host: Generic without the AVX-512 variant, Amx for bf16 where
// bf16_path() is amx, else Avx512.
AttnKernel default_attn_kernel(DType dtype);

// The tiling for `kernel` on `dtype` inputs: kWideTiling on AMX tiles and for bf16 widened to float32 (the
// fma32 path), the default elsewhere.
AttentionTiling default_attn_tiling(DType dtype, AttnKernel kernel);

}  // namespace kiln::cpu_kernels
