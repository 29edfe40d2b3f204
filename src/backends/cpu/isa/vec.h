// Portable 16-lane float vectors for the kernels in this folder. Written with GCC vector extensions, so each
// file here compiles to AVX-512 in the avx512 variant and to narrower SSE/AVX code in the generic variant.
// Only files under src/backends/cpu/isa/ may include this header (they are built once per ISA, each inside
// namespace kiln::cpu_kernels::KILN_ISA). Math functions here avoid libm in hot loops: glibc's scalar
// tanhf/expf are 10-50x slower than these and block vectorization. No -ffast-math anywhere.
#pragma once

#include <cstdint>
#include <cstring>

#include "kiln/core/half.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#ifndef KILN_ISA
#error "vec.h is only for the per-ISA kernel files under src/backends/cpu/isa/"
#endif

namespace kiln::cpu_kernels::KILN_ISA {

inline constexpr int kLanes = 16;
typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));

// Every lane v. Not `f32x16{} + v`: 0 + v is not v for v = -0, so GCC kept the add and broadcast its result
// from a register (two uops on the FMA ports per call; a third of a micro-kernel's issue slots when the
// broadcast operand is a runtime value). Listing the lanes compiles to one broadcast, from memory where v
// is loaded.
inline f32x16 splat(float v) {
  return f32x16{v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v};
}
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

// 64 bytes of any 32-bit lanes (bf16 pairs, for the transposes that move them) as a vector, and back: the
// bits move, nothing is converted.
inline f32x16 load_bits(const void* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_bits(void* p, f32x16 v) {
  std::memcpy(p, &v, sizeof v);
}

// ---- loads and stores (unaligned), converting to/from float32 lanes
inline f32x16 load(const float* p) {
  return load_bits(p);
}
inline void store(float* p, f32x16 v) {
  store_bits(p, v);
}

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
#if defined(__AVX512F__)
  // VCVTPH2PS is exact, subnormals and NaNs included.
  const __m512 r = _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  f32x16 v;
  std::memcpy(&v, &r, sizeof v);
  return v;
#else
  f32x16 v;
  for (int i = 0; i < kLanes; ++i) v[i] = f16_to_f32(p[i]);
  return v;
#endif
}
inline void store(f16_t* p, f32x16 v) {
#if defined(__AVX512F__)
  // VCVTPS2PH with an explicit round-to-nearest-even immediate (independent of MXCSR) matches f32_to_f16,
  // subnormal results included; NaNs come out as quiet NaNs.
  __m512 r;
  std::memcpy(&r, &v, sizeof r);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_maskz_cvtps_ph(0xffff, r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  for (int i = 0; i < kLanes; ++i) p[i] = f32_to_f16(v[i]);
#endif
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
inline f32x16 vmax(f32x16 a, f32x16 b) {
  return a > b ? a : b;
}
inline f32x16 vmin(f32x16 a, f32x16 b) {
  return a < b ? a : b;
}
inline f32x16 vabs(f32x16 a) {
  return bits_to_f32(f32_to_bits(a) & 0x7fffffffu);
}
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

#if defined(__AVX512F__)
inline __m512 to_m512(f32x16 v) {
  __m512 r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}
inline f32x16 from_m512(__m512 v) {
  f32x16 r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}
#endif

// a * b + c: one fused instruction (single rounding) in the AVX-512 variant, two roundings in the portable
// one.
inline f32x16 vfma(f32x16 a, f32x16 b, f32x16 c) {
#if defined(__AVX512F__)
  return from_m512(_mm512_fmadd_ps(to_m512(a), to_m512(b), to_m512(c)));
#else
  return a * b + c;
#endif
}

// ---- exp: range reduction to [-ln2/2, ln2/2] and a degree-7 polynomial (max rel. error ~2 ulp over the
// float range). Portable variant: exp(x) = 0 below -87.3 (torch returns subnormals there; differences
// < 1e-38), inf above 88.72.
#if defined(__AVX512F__)
// The AVX-512 exp on an argument already in [-104, 89] (or NaN, which stays NaN): what vexp runs after its
// clamp, for callers whose arguments are known to need less clamping (the attention softmax's).
inline f32x16 vexp_in_range(f32x16 xc) {
  const __m512 n = _mm512_maskz_roundscale_ps(0xffff, to_m512(xc * 1.44269504088896341f),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const f32x16 nf = from_m512(n);
  f32x16 r = vfma(nf, splat(-0.693359375f), xc);
  r = vfma(nf, splat(2.12194440e-4f), r);
  f32x16 p = splat(1.9875691500e-4f);
  p = vfma(p, r, splat(1.3981999507e-3f));
  p = vfma(p, r, splat(8.3334519073e-3f));
  p = vfma(p, r, splat(4.1665795894e-2f));
  p = vfma(p, r, splat(1.6666665459e-1f));
  p = vfma(p, r, splat(5.0000001201e-1f));
  p = vfma(p, r * r, r) + 1.0f;
  return from_m512(_mm512_maskz_scalef_ps(0xffff, to_m512(p), n));
}
#endif

inline f32x16 vexp(f32x16 x) {
#if defined(__AVX512F__)
  // Same reduction and polynomial, but VRNDSCALEPS rounds and VSCALEFPS applies 2^n with correct overflow to
  // inf and gradual underflow (subnormal results, like torch), with FMAs: about a third of the instructions
  // and of the dependency chain of the portable version, which matters because exp sits inside
  // silu/gelu/sigmoid/softmax. The clamp keeps NaN (comparisons with NaN are false) and keeps n finite for
  // +-inf.
  f32x16 xc = x > 89.0f ? splat(89.0f) : x;
  xc = xc < -104.0f ? splat(-104.0f) : xc;
  return vexp_in_range(xc);
#else
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
#endif
}

// ---- helpers for the functions below
inline f32x16 vcopysign(f32x16 mag, f32x16 sign) {
  return bits_to_f32((f32_to_bits(mag) & 0x7fffffffu) | (f32_to_bits(sign) & 0x80000000u));
}
// Polynomial c[0] + c[1] t + ... in Horner form with vfma. The error bounds quoted below were measured with
// two roundings per step (the portable variant); the fused steps of the AVX-512 variant only tighten them.
template <size_t N>
inline f32x16 vpoly(f32x16 t, const float (&c)[N]) {
  f32x16 p = splat(c[N - 1]);
  for (size_t i = N - 1; i-- > 0;) p = vfma(p, t, splat(c[i]));
  return p;
}

// Correctly rounded square root (VSQRTPS in the AVX-512 variant).
inline f32x16 vsqrt(f32x16 x) {
#if defined(__AVX512F__)
  __m512 r;
  std::memcpy(&r, &x, sizeof r);
  r = _mm512_maskz_sqrt_ps(0xffff, r);  // maskz: the unmasked form trips -Wmaybe-uninitialized in GCC 12
  f32x16 v;
  std::memcpy(&v, &r, sizeof v);
  return v;
#else
  f32x16 v;
  for (int i = 0; i < kLanes; ++i) v[i] = __builtin_sqrtf(x[i]);
  return v;
#endif
}

// Natural log: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) = f - f^2/2 + f^3 P(f) with f = m - 1
// (P fitted to log1p on that interval, <= 0.7 ulp), e ln2 added in two parts. Max error ~1 ulp.
// log(0) = -inf, log(x < 0) = NaN, log(inf) = inf; subnormal inputs are exact.
inline f32x16 vlog(f32x16 x) {
  static constexpr float kP[] = {0.3333335518836975f,   -0.2500085234642029f, 0.19999825954437256f,
                                 -0.16621370613574982f, 0.14227114617824554f, -0.13202103972434998f,
                                 0.1262032687664032f,   -0.07362867891788483f};
  const auto subnormal = x < 1.17549435e-38f;
  const f32x16 xs = subnormal ? x * 8388608.0f : x;  // 2^23 makes subnormals normal
  const u32x16 u = f32_to_bits(xs);
  i32x16 e = __builtin_convertvector(u >> 23, i32x16) - 127;
  e = subnormal ? e - 23 : e;
  f32x16 m = bits_to_f32((u & 0x007fffffu) | 0x3f800000u);
  const auto big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e = big ? e + 1 : e;
  const f32x16 f = m - 1.0f;
  const f32x16 f2 = f * f;
  const f32x16 ef = __builtin_convertvector(e, f32x16);
  f32x16 y = f2 * f * vpoly(f, kP) - 0.5f * f2;
  y = (ef * -2.12194440e-4f + y) + f;
  y = y + ef * 0.693359375f;
  y = x == 0.0f ? splat(-__builtin_inff()) : y;
  y = x < 0.0f ? splat(__builtin_nanf("")) : y;
  y = x == __builtin_inff() ? x : y;
  return x != x ? x : y;
}

// tanh: x + x^3 P(x^2) for |x| < 0.625 (<= 0.9 ulp), else 1 - 2 / (exp(2|x|) + 1) with x's sign.
inline f32x16 vtanh(f32x16 x) {
  static constexpr float kP[] = {-0.3333328664302826f, 0.13331513106822968f, -0.053744662553071976f,
                                 0.020653141662478447f, -0.005718979053199291f};
  const f32x16 ax = vabs(x);
  const f32x16 x2 = x * x;
  const f32x16 small = vcopysign(x + x * x2 * vpoly(x2, kP), x);  // keeps tanh(-0) = -0
  const f32x16 big = vcopysign(1.0f - 2.0f / (vexp(ax + ax) + 1.0f), x);
  return ax < 0.625f ? small : big;  // NaN fails the test and propagates through vexp
}

// erf: x P(x^2) for |x| < 1 (<= 2.5 ulp); 1 - exp(-x^2) R(|x| - 2.5) on [1, 4) (R fitted to erfcx, <= 1 ulp);
// +-1 beyond.
inline f32x16 verf(f32x16 x) {
  static constexpr float kP[] = {1.128379225730896f,     -0.3761262893676758f,   0.11283612251281738f,
                                 -0.026854807510972023f, 0.0051900530233979225f, -0.000802435155492276f,
                                 7.898201874922961e-05f};
  static constexpr float kR[] = {0.21080635488033295f,    -0.0743473619222641f,     0.024938173592090607f,
                                 -0.008001474663615227f,  0.0024660928174853325f,   -0.0007337129791267216f,
                                 0.00021283204841893166f, -5.8942707255482674e-05f, 1.4425777408177964e-05f,
                                 -4.009343228972284e-06f, 1.6588418247920345e-06f,  -3.835798736417928e-07f};
  const f32x16 ax = vabs(x);
  const f32x16 x2 = x * x;
  const f32x16 small = x * vpoly(x2, kP);
  const f32x16 t = vmin(ax, splat(4.0f)) - 2.5f;
  f32x16 big = 1.0f - vexp(-x2) * vpoly(t, kR);
  big = ax >= 4.0f ? splat(1.0f) : big;
  const f32x16 y = ax < 1.0f ? small : vcopysign(big, x);
  return x != x ? x : y;
}

// 1 / (1 + exp(-x)), the formula torch uses; saturates to 0 and 1 without NaNs.
inline f32x16 vsigmoid(f32x16 x) {
  return 1.0f / (1.0f + vexp(-x));
}

}  // namespace kiln::cpu_kernels::KILN_ISA
