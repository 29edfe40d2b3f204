// A 16 x 16 transpose of 32-bit lanes in registers for the per-ISA kernels: the fma32 and AMX GEMMs' weight
// packing (floats, and bf16 pairs as 32-bit lanes) and the norms' sums of 16 rows at once.
#pragma once

#include <utility>

#include "backends/cpu/isa/vec.h"

namespace kiln::cpu_kernels::KILN_ISA {

// Swapping the off-diagonal S x S blocks of every 2S x 2S block, for S = 8, 4, 2, 1, transposes a 16 x 16
// matrix held as 16 row vectors: 64 two-vector shuffles for 256 floats, where going through memory costs a
// store and a load per float.
template <int S, size_t... C>
inline void swap_blocks(f32x16& a, f32x16& b, std::index_sequence<C...>) {
  const f32x16 lo = __builtin_shufflevector(a, b, ((C & S) ? kLanes + C - S : C)...);
  const f32x16 hi = __builtin_shufflevector(a, b, ((C & S) ? kLanes + C : C + S)...);
  a = lo;
  b = hi;
}

template <int S>
inline void swap_blocks(f32x16 (&v)[kLanes]) {
#pragma GCC unroll 16
  for (int i = 0; i < kLanes; ++i) {
    if ((i & S) == 0) swap_blocks<S>(v[i], v[i + S], std::make_index_sequence<kLanes>());
  }
}

// v[r][c] <- v[c][r].
inline void transpose_16x16(f32x16 (&v)[kLanes]) {
  swap_blocks<8>(v);
  swap_blocks<4>(v);
  swap_blocks<2>(v);
  swap_blocks<1>(v);
}

}  // namespace kiln::cpu_kernels::KILN_ISA
