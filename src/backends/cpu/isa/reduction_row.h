// Row primitives shared by the reduction, norm and rope kernels of one ISA variant: typed dispatch over the
// float storage types, f32 rounding to a storage type, and accurate vectorized row sums.
#pragma once

#include <omp.h>

#include <cmath>
#include <cstdint>

#include "backends/cpu/isa/transpose16.h"
#include "backends/cpu/isa/vec.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"

namespace kiln::cpu_kernels::KILN_ISA {

// Calls f(T{}) for the float storage types the vectorized kernels handle.
template <class F>
decltype(auto) visit_float(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f(float{});
    case DType::BFloat16:
      return f(bf16_t{});
    case DType::Float16:
      return f(f16_t{});
    default:
      KILN_FAIL("internal: vectorized kernel called with dtype " << dtype_name(dtype));
  }
}

template <class T>
inline T from_float(float v) {
  if constexpr (std::is_same_v<T, bf16_t>)
    return f32_to_bf16(v);
  else if constexpr (std::is_same_v<T, f16_t>)
    return f32_to_f16(v);
  else
    return v;
}
template <class T>
inline float to_float(T v) {
  if constexpr (std::is_same_v<T, bf16_t>)
    return bf16_to_f32(v);
  else if constexpr (std::is_same_v<T, f16_t>)
    return f16_to_f32(v);
  else
    return v;
}

// Rounds every lane to the storage type T and back, as torch's .to(T) does between two float32 ops.
template <class T>
inline f32x16 round_to(f32x16 v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    // In registers, with f32_to_bf16's rounding (nearest even; NaNs stay NaN): a store/load round trip
    // through memory costs twice as much in rms_norm's write loop.
    const u32x16 u = f32_to_bits(v);
    const u32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return bits_to_f32((u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) & 0xffff0000u : rounded);
  } else {
    T tmp[kLanes];
    store(tmp, v);
    return load(tmp);
  }
}

// Elements summed in float32 lanes before the partial sum moves to double: keeps a float32 row sum accurate
// to ~1e-7 relative however long the row is, at no measurable cost.
inline constexpr int64_t kSumBlock = 4096;

// The lanes of f(x[i]) summed over one block (n <= kSumBlock) with four independent vector accumulators;
// block_sum adds the lanes up.
template <class T, class F>
inline f32x16 block_partial(const T* x, int64_t n, F f) {
  f32x16 a0{}, a1{}, a2{}, a3{};
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    a0 += f(load(x + i));
    a1 += f(load(x + i + kLanes));
    a2 += f(load(x + i + 2 * kLanes));
    a3 += f(load(x + i + 3 * kLanes));
  }
  for (; i + kLanes <= n; i += kLanes) a0 += f(load(x + i));
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    f32x16 v = f(load_partial(x + i, rest));
    for (int l = rest; l < kLanes; ++l) v[l] = 0.0f;  // f(0) need not be 0
    a1 += v;
  }
  return (a0 + a1) + (a2 + a3);
}

template <class T, class F>
inline float block_sum(const T* x, int64_t n, F f) {
  return reduce_add(block_partial(x, n, f));
}

// reduce_add of 16 vectors at once: lane r of the result is reduce_add(v[r]), added in its order (lane 0
// first), so the sums are the same to the bit. A transpose and 15 vector additions, where 16 reduce_adds are
// 16 chains of 16 dependent scalar additions. v is overwritten.
inline f32x16 reduce_add_16(f32x16 (&v)[kLanes]) {
  transpose_16x16(v);
  f32x16 s = splat(0.0f) + v[0];
#pragma GCC unroll 16
  for (int l = 1; l < kLanes; ++l) s += v[l];
  return s;
}

// reduce_max of 16 vectors at once: lane r of the result is reduce_max(v[r]), compared in its order (so a
// NaN counts only in lane 0, as there). v is overwritten.
inline f32x16 reduce_max_16(f32x16 (&v)[kLanes]) {
  transpose_16x16(v);
  f32x16 m = v[0];
#pragma GCC unroll 16
  for (int l = 1; l < kLanes; ++l) m = vmax(v[l], m);
  return m;
}

// Sum of f(x[i]) over a row of any length, block partials accumulated in double.
template <class T, class F>
inline double row_sum(const T* x, int64_t n, F f) {
  double s = 0;
  for (int64_t i = 0; i < n; i += kSumBlock) s += block_sum(x + i, n - i < kSumBlock ? n - i : kSumBlock, f);
  return s;
}

struct Identity {
  f32x16 operator()(f32x16 v) const { return v; }
};

// Maximum of a row (n >= 1); NaN when any element is NaN, as torch.max.
template <class T>
inline float row_max(const T* x, int64_t n) {
  const f32x16 ninf = splat(-__builtin_inff());
  f32x16 m0 = ninf, m1 = ninf;
  i32x16 nan{};
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const f32x16 v0 = load(x + i), v1 = load(x + i + kLanes);
    nan |= (v0 != v0) | (v1 != v1);
    m0 = vmax(m0, v0);
    m1 = vmax(m1, v1);
  }
  for (; i + kLanes <= n; i += kLanes) {
    const f32x16 v = load(x + i);
    nan |= v != v;
    m0 = vmax(m0, v);
  }
  if (i < n) {
    const f32x16 v = load_partial(x + i, static_cast<int>(n - i), -__builtin_inff());
    nan |= v != v;
    m1 = vmax(m1, v);
  }
  for (int l = 0; l < kLanes; ++l)
    if (nan[l]) return __builtin_nanf("");
  return reduce_max(vmax(m0, m1));
}

}  // namespace kiln::cpu_kernels::KILN_ISA
