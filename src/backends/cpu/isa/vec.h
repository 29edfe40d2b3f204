// Portable 16-lane float vectors for the kernels in this folder. Written with GCC vector extensions, so each
// file here compiles to AVX-512 in the avx512 variant and to narrower SSE/AVX code in the generic variant.
// Only files under src/backends/cpu/isa/ may include this header (they are built once per ISA, each inside
// namespace kiln::cpu_kernels::KILN_ISA). Math functions here avoid libm in hot loops: glibc's scalar
// tanhf/expf are 10-50x slower than these and block vectorization. No -ffast-math anywhere.
#pragma once

#include <cstdint>
#include <cstring>

#include "kiln/core/half.h"

#ifndef KILN_ISA
#error "vec.h is only for the per-ISA kernel files under src/backends/cpu/isa/"
#endif

namespace kiln::cpu_kernels::KILN_ISA {

inline constexpr int kLanes = 16;
typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));

inline f32x16 splat(float v) { return f32x16{} + v; }
inline f32x16 bits_to_f32(u32x16 v) {
  f32x16 r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}
inline u32x16 f32_to_bits(f32x16 v) {
  u32x16 r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}

// ---- loads and stores (unaligned), converting to/from float32 lanes
inline f32x16 load(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, f32x16 v) { std::memcpy(p, &v, sizeof v); }

inline f32x16 load(const bf16_t* p) {
  u16x16 h;
  std::memcpy(&h, p, sizeof h);
  return bits_to_f32(__builtin_convertvector(h, u32x16) << 16);
}
inline void store(bf16_t* p, f32x16 v) {
  // Round to nearest even; NaNs stay NaN (quiet bit forced) instead of rounding into infinity.
  u32x16 u = f32_to_bits(v);
  const u32x16 is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  u32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  rounded = is_nan ? ((u >> 16) | 0x40u) : rounded;
  const u16x16 h = __builtin_convertvector(rounded, u16x16);
  std::memcpy(p, &h, sizeof h);
}

inline f32x16 load(const f16_t* p) {
  f32x16 v;
  for (int i = 0; i < kLanes; ++i) v[i] = f16_to_f32(p[i]);
  return v;
}
inline void store(f16_t* p, f32x16 v) {
  for (int i = 0; i < kLanes; ++i) p[i] = f32_to_f16(v[i]);
}

// Partial loads/stores for the last n < 16 elements of a row; the remaining lanes read as `fill`.
template <class T>
inline f32x16 load_partial(const T* p, int n, float fill = 0.0f) {
  T tmp[kLanes] = {};
  for (int i = 0; i < n; ++i) tmp[i] = p[i];
  f32x16 v = load(tmp);
  for (int i = n; i < kLanes; ++i) v[i] = fill;
  return v;
}
template <class T>
inline void store_partial(T* p, f32x16 v, int n) {
  T tmp[kLanes];
  store(tmp, v);
  for (int i = 0; i < n; ++i) p[i] = tmp[i];
}

// ---- basic lane operations
inline f32x16 vmax(f32x16 a, f32x16 b) { return a > b ? a : b; }
inline f32x16 vmin(f32x16 a, f32x16 b) { return a < b ? a : b; }
inline f32x16 vabs(f32x16 a) { return bits_to_f32(f32_to_bits(a) & 0x7fffffffu); }
inline f32x16 vfloor(f32x16 x) {
  // Valid for |x| < 2^31; callers clamp first.
  const f32x16 t = __builtin_convertvector(__builtin_convertvector(x, i32x16), f32x16);
  return t > x ? t - 1.0f : t;
}
inline float reduce_add(f32x16 v) {
  float s = 0;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}
inline float reduce_max(f32x16 v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// ---- exp: range reduction to [-ln2/2, ln2/2] and a degree-7 polynomial (max rel. error ~2 ulp over the
// float range). exp(x) = 0 below -87.3 (torch returns subnormals there; differences < 1e-38), inf above 88.72.
inline f32x16 vexp(f32x16 x) {
  const f32x16 xc = vmin(vmax(x, splat(-87.33654f)), splat(88.72283f));
  const f32x16 n = vfloor(xc * 1.44269504088896341f + 0.5f);
  // Two-constant Cody-Waite reduction keeps r accurate.
  f32x16 r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  f32x16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // Scale by 2^n as 2^(n/2) * 2^(n - n/2): each factor stays a normal float for n in [-126, 128].
  const i32x16 ni = __builtin_convertvector(n, i32x16);
  const i32x16 n1 = ni >> 1, n2 = ni - n1;
  const f32x16 s1 = bits_to_f32(__builtin_convertvector((n1 + 127) << 23, u32x16));
  const f32x16 s2 = bits_to_f32(__builtin_convertvector((n2 + 127) << 23, u32x16));
  f32x16 y = p * s1 * s2;
  y = x > 88.72283f ? splat(__builtin_inff()) : y;
  y = x < -87.33654f ? splat(0.0f) : y;
  return x != x ? x : y;  // NaN in, NaN out
}

}  // namespace kiln::cpu_kernels::KILN_ISA
