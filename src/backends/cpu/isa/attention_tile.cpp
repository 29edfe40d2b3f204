// Attention on one query tile: the two products (scores S = Q K^T and O = O * alpha + P V) as
// register-blocked micro-kernels over packed operands, and the online softmax between them, all in float32
// accumulators. The AVX-512 variant multiplies bfloat16 pairs with VDPBF16PS, or on AMX tiles where the
// driver asks for them (amx_tiles.h), and float32 with FMA; the generic variant runs the same loops on
// portable vectors, widening bfloat16 pairs to float.
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <utility>

#include "backends/cpu/attention_tile.h"
#include "backends/cpu/isa/amx_tiles.h"
#include "backends/cpu/isa/reduction_row.h"
#include "backends/cpu/isa/transpose16.h"
#include "backends/cpu/isa/vec.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {

// ---- packing helpers

template <class T>
inline float to_float(T v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, bf16_t>)
    return bf16_to_f32(v);
  else
    return f16_to_f32(v);
}

// A source element as stored for the math: raw bfloat16 bits, or float.
template <class Out, class T>
inline Out packed(T v) {
  if constexpr (std::is_same_v<Out, uint16_t>)
    return v.bits;
  else
    return to_float(v);
}

// The math's element and the dtype it packs from: BF16 math packs bfloat16 bits; F32 math converts
// float32, float16 or bfloat16 sources to float. Calls f(Out{}, T{}).
template <class F>
void visit_packing(AttnMath math, DType src, F&& f) {
  if (math == AttnMath::BF16)
    f(uint16_t{}, bf16_t{});
  else if (src == float16)
    f(float{}, f16_t{});
  else if (src == bfloat16)
    f(float{}, bf16_t{});
  else
    f(float{}, float{});
}

template <class Out>
constexpr int64_t pair_of() {
  return std::is_same_v<Out, uint16_t> ? 2 : 1;
}

// Rows of q, k and v are usually heads of a [B, S, H, D] projection: each row sits on its own page, so
// neither the hardware prefetcher (which stops at page boundaries) nor out-of-order execution keeps enough
// misses in flight, and packing ran at under 1 GB/s. Prefetching a row kPrefetchRows ahead fixes that.
constexpr int64_t kPrefetchRows = 12;

// GCC 12's dead-code elimination drops __builtin_prefetch / _mm_prefetch in these loops; asm volatile stays.
inline void prefetch(const char* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*p));
#else
  __builtin_prefetch(p);
#endif
}

template <class T>
inline void prefetch_row(const AttnMatrix& src, int64_t r) {
  if (r >= src.rows) return;
  const char* p = reinterpret_cast<const char*>(static_cast<const T*>(src.data) + r * src.row_stride);
  const int64_t bytes = src.cols * static_cast<int64_t>(sizeof(T));
  for (int64_t b = 0; b < bytes; b += 64) prefetch(p + b);
  prefetch(p + bytes - 1);
}

// 16 units of the math's element, one per lane: 16 floats (widened from T), or 16 pairs of bfloat16 bits as
// 32-bit lanes (BF16 math, bf16 sources). The vector paths below move whole 16-unit chunks; what is left at
// the edges (the last columns, a partial block of keys, zero padding) goes element by element.
template <class Out, class T>
inline f32x16 load_units(const T* p) {
  if constexpr (std::is_same_v<Out, uint16_t>)
    return load_bits(p);
  else
    return load(p);
}
template <class Out>
constexpr int64_t unit_elems() {
  return kLanes * pair_of<Out>();
}

template <class Out, class T>
void pack_rows_as(const AttnMatrix& src, Out* dst, int64_t cols_pad) {
  for (int64_t r = 0; r < src.rows; ++r) {
    prefetch_row<T>(src, r + kPrefetchRows);
    const T* row = static_cast<const T*>(src.data) + r * src.row_stride;
    Out* o = dst + r * cols_pad;
    int64_t c = 0;
    for (; c + unit_elems<Out>() <= src.cols; c += unit_elems<Out>())
      store_bits(o + c, load_units<Out>(row + c));
    for (; c < src.cols; ++c) o[c] = packed<Out>(row[c]);
    for (; c < cols_pad; ++c) o[c] = Out{};
  }
}

// Each 16-key block is a [cols_pad / pair][16][pair] tile (element (lane, c) at c * 16 + lane * pair + c %
// pair): a key's row is scattered 16 * pair elements apart, and the block (16 * cols_pad elements) stays in
// L1 while it is written. A whole block of keys moves 16 units of each key at a time, transposed in
// registers (16 rows of 16 units become 16 vectors of one unit of every key).
template <class Out, class T>
void pack_keys_as(const AttnMatrix& src, Out* dst, int64_t rows_pad, int64_t cols_pad) {
  constexpr int64_t pair = pair_of<Out>();
  const int64_t full = src.cols / pair * pair;
  for (int64_t r0 = 0; r0 < rows_pad; r0 += kAttnBlock) {
    Out* block = dst + r0 * cols_pad;
    // Columns [0, vector_end) of a whole block of keys go through registers.
    int64_t vector_end = 0;
    if (r0 + kAttnBlock <= src.rows) {
      vector_end = src.cols / unit_elems<Out>() * unit_elems<Out>();
      for (int64_t lane = 0; lane < kAttnBlock; ++lane) prefetch_row<T>(src, r0 + kAttnBlock + lane);
      const T* first = static_cast<const T*>(src.data) + r0 * src.row_stride;
      for (int64_t c = 0; c < vector_end; c += unit_elems<Out>()) {
        f32x16 v[kLanes];
#pragma GCC unroll 16
        for (int lane = 0; lane < kLanes; ++lane)
          v[lane] = load_units<Out>(first + lane * src.row_stride + c);
        transpose_16x16(v);
#pragma GCC unroll 16
        for (int u = 0; u < kLanes; ++u) store_bits(block + c * kAttnBlock + u * unit_elems<Out>(), v[u]);
      }
    }
    for (int64_t lane = 0; lane < kAttnBlock; ++lane) {
      const int64_t r = r0 + lane;
      Out* o = block + lane * pair;
      if (vector_end == 0) prefetch_row<T>(src, r + kPrefetchRows);
      const T* row = r < src.rows ? static_cast<const T*>(src.data) + r * src.row_stride : nullptr;
      int64_t c = vector_end;
      if (row) {
        for (; c < full; c += pair) {
          for (int64_t t = 0; t < pair; ++t) o[c * kAttnBlock + t] = packed<Out>(row[c + t]);
        }
      }
      for (; c < cols_pad; c += pair) {
        for (int64_t t = 0; t < pair; ++t) {
          o[c * kAttnBlock + t] = row && c + t < src.cols ? packed<Out>(row[c + t]) : Out{};
        }
      }
    }
  }
}

// Columns [c0, c0 + 16) of `pair` consecutive rows, interleaved as the values' layout holds them: floats
// as they are; with BF16 math a row's bfloat16 bits in the low half of each 32-bit lane, the next row's in
// the high half.
template <class Out, class T>
inline f32x16 value_units(const T* row, int64_t row_stride, int64_t c0) {
  if constexpr (std::is_same_v<Out, uint16_t>) {
    u16x16 even, odd;
    std::memcpy(&even, row + c0, sizeof even);
    std::memcpy(&odd, row + row_stride + c0, sizeof odd);
    return bits_to_f32(__builtin_convertvector(even, u32x16) | (__builtin_convertvector(odd, u32x16) << 16));
  } else {
    return load(row + c0);
  }
}

// Each 16-column block is a [rows_pad / pair][16][pair] tile: `pair` consecutive rows interleaved.
template <class Out, class T>
void pack_values_as(const AttnMatrix& src, Out* dst, int64_t rows_pad, int64_t cols_pad) {
  constexpr int64_t pair = pair_of<Out>();
  for (int64_t r0 = 0; r0 < rows_pad; r0 += pair) {
    // Whole 16-column blocks of rows that all exist move a vector at a time.
    int64_t vector_end = 0;
    if (r0 + pair <= src.rows) {
      vector_end = src.cols / kAttnBlock * kAttnBlock;
      for (int64_t t = 0; t < pair; ++t) prefetch_row<T>(src, r0 + t + kPrefetchRows);
      const T* row = static_cast<const T*>(src.data) + r0 * src.row_stride;
      for (int64_t c0 = 0; c0 < vector_end; c0 += kAttnBlock) {
        store_bits(dst + c0 * rows_pad + r0 * kAttnBlock, value_units<Out>(row, src.row_stride, c0));
      }
    }
    for (int64_t t = 0; t < pair; ++t) {
      const int64_t r = r0 + t;
      if (vector_end == 0) prefetch_row<T>(src, r + kPrefetchRows);
      const T* row = r < src.rows ? static_cast<const T*>(src.data) + r * src.row_stride : nullptr;
      for (int64_t c0 = vector_end; c0 < cols_pad; c0 += kAttnBlock) {
        Out* o = dst + c0 * rows_pad + r0 * kAttnBlock + t;
        if (row && c0 + kAttnBlock <= src.cols) {
          for (int64_t c = 0; c < kAttnBlock; ++c) o[c * pair] = packed<Out>(row[c0 + c]);
        } else {
          for (int64_t c = 0; c < kAttnBlock; ++c) {
            o[c * pair] = row && c0 + c < src.cols ? packed<Out>(row[c0 + c]) : Out{};
          }
        }
      }
    }
  }
}

// ---- the multiply-accumulate step of each math, on one 16-lane accumulator

// Float32: a broadcast float times a vector of 16 floats.
struct F32Math {
  using Elem = float;
  static constexpr int kPair = 1;
  using AVal = f32x16;
  using BVal = f32x16;
  static AVal load_a(const float* p) { return splat(*p); }
  static BVal load_b(const float* p) { return load(p); }
  static f32x16 madd(f32x16 acc, AVal a, BVal b) {
#if defined(__AVX512F__)
    return _mm512_fmadd_ps(a, b, acc);
#else
    return acc + a * b;
#endif
  }
};

// BFloat16: a broadcast pair (x[k], x[k+1]) times 16 pairs, summed pairwise into each float lane.
struct Bf16Math {
  using Elem = uint16_t;
  static constexpr int kPair = 2;
#if defined(__AVX512BF16__)
  using AVal = __m512i;
  using BVal = __m512i;
  static AVal load_a(const uint16_t* p) {
    int32_t w;
    std::memcpy(&w, p, sizeof w);
    return _mm512_set1_epi32(w);
  }
  static BVal load_b(const uint16_t* p) {
    return _mm512_loadu_si512(p);
  }
  static f32x16 madd(f32x16 acc, AVal a, BVal b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
  }
#else
  struct AVal {
    float even, odd;
  };
  struct BVal {
    f32x16 even, odd;
  };
  static AVal load_a(const uint16_t* p) {
    return {bf16_to_f32(bf16_t{p[0]}), bf16_to_f32(bf16_t{p[1]})};
  }
  static BVal load_b(const uint16_t* p) {
    u32x16 w;
    std::memcpy(&w, p, sizeof w);
    return {bits_to_f32(w << 16), bits_to_f32(w & 0xffff0000u)};
  }
  static f32x16 madd(f32x16 acc, AVal a, BVal b) {
    return acc + a.even * b.even + a.odd * b.odd;
  }
#endif
};

// Register block of the products: MR rows x NR vectors of 16 columns. AVX-512: 24 accumulators, so that
// the B vectors and one broadcast still fit in the 32 registers. Generic (a 16-float vector is four SSE
// registers, 16 in all): 3 x 1 measured fastest at S = 512 (bf16 37, f32 26 GFLOP/s per core, against 10
// and 9 with 6 x 4, whose accumulators live on the stack).
#if defined(__AVX512F__)
constexpr int kMR = 6;
constexpr int kNR = 4;
#else
constexpr int kMR = 3;
constexpr int kNR = 1;
#endif

// c[MR][NR * 16] = (row_scale ? c * row_scale[m] : 0) + sum_k a[m][k] * b[k][n] over `ksteps` steps of
// M::kPair elements. a rows are a_stride elements apart; B's column blocks are b_stride elements apart,
// each holding ksteps consecutive groups of 16 * kPair elements.
template <class M, int MR, int NR>
void micro_kernel(int64_t ksteps, const typename M::Elem* __restrict a, int64_t a_stride,
                  const typename M::Elem* __restrict b, int64_t b_stride, float* __restrict c,
                  int64_t c_stride, const float* __restrict row_scale) {
  f32x16 acc[MR][NR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      acc[m][n] = row_scale ? load(c + m * c_stride + n * kLanes) * row_scale[m] : splat(0.0f);
    }
  }
  for (int64_t k = 0; k < ksteps; ++k) {
    typename M::BVal bv[NR];
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) bv[n] = M::load_b(b + n * b_stride + k * kLanes * M::kPair);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const typename M::AVal av = M::load_a(a + m * a_stride + k * M::kPair);
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n) acc[m][n] = M::madd(acc[m][n], av, bv[n]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) store(c + m * c_stride + n * kLanes, acc[m][n]);
  }
}

template <class M>
using MicroKernel = void (*)(int64_t, const typename M::Elem*, int64_t, const typename M::Elem*, int64_t,
                             float*, int64_t, const float*);

template <class M, size_t... I>
constexpr std::array<MicroKernel<M>, sizeof...(I)> make_kernels(std::index_sequence<I...>) {
  return {&micro_kernel<M, static_cast<int>(I / kNR) + 1, static_cast<int>(I % kNR) + 1>...};
}

// The whole product of a tile: rows x (col_blocks * 16), in register blocks; the B block of NR column blocks
// stays in L1 while all rows pass over it.
template <class M>
void tile_product(int64_t rows, int64_t col_blocks, int64_t ksteps, const typename M::Elem* a,
                  int64_t a_stride, const typename M::Elem* b, int64_t b_stride, float* c, int64_t c_stride,
                  const float* row_scale) {
  static constexpr auto kernels = make_kernels<M>(std::make_index_sequence<kMR * kNR>());
  for (int64_t n0 = 0; n0 < col_blocks; n0 += kNR) {
    const int nr = static_cast<int>(std::min<int64_t>(kNR, col_blocks - n0));
    for (int64_t m0 = 0; m0 < rows; m0 += kMR) {
      const int mr = static_cast<int>(std::min<int64_t>(kMR, rows - m0));
      kernels[(mr - 1) * kNR + (nr - 1)](ksteps, a + m0 * a_stride, a_stride, b + n0 * b_stride, b_stride,
                                         c + m0 * c_stride + n0 * kLanes, c_stride,
                                         row_scale ? row_scale + m0 : nullptr);
    }
  }
}

// ---- online softmax

// The softmax's exponential, as 2^x: the scores' scale and the running max are taken to base 2 once per row
// (log2(e) folded into the scale), so that each element costs a split into integer and fraction and a
// degree-5 polynomial (relative error 1.6e-7, within an ulp or two of exp's) instead of exp's multiply,
// two-step Cody-Waite reduction and degree-7 polynomial: the loop that applies it is most of attention's time
// beside AMX's products, and with head size 64 (SD3.5) it outweighs them.
// Arguments are <= 0 up to the rounding of the scale (a few ulp above 0 at most), -inf for masked scores
// (which must give exactly 0), NaN for NaN inputs.
constexpr float kLog2e = 1.44269504088896341f;

// p(r) = 1 + c[0] r + ... + c[4] r^5, Horner's scheme.
inline f32x16 exp2_poly(f32x16 r, const float (&c)[5]) {
  f32x16 p = splat(c[4]);
  p = vfma(p, r, splat(c[3]));
  p = vfma(p, r, splat(c[2]));
  p = vfma(p, r, splat(c[1]));
  p = vfma(p, r, splat(c[0]));
  return vfma(p, r, splat(1.0f));
}

#if defined(__AVX512F__)
// 2^x = p(x - floor x) * 2^floor(x). VREDUCEPS gives x - floor(x) in one instruction and VSCALEFPS applies
// 2^floor(x) to p itself (it floors its exponent operand, with gradual underflow), so the integer part is
// never formed, and neither needs a clamp: VREDUCEPS takes -inf to 0 and VSCALEFPS then scales 1 by 2^-inf
// to exactly 0, NaN stays NaN through both. 7 vector instructions per 16 elements, where clamping, rounding
// to nearest (VRNDSCALEPS, two uops on Intel cores) and subtracting it took 10.
// Coefficients: a fit of 2^r minimising the relative error on [0, 1] (1.6e-7 evaluated in float32), constant
// term 1, so that the row's maximum gives exactly 1.
constexpr float kExp2PolyUnit[] = {6.9315129519e-1f, 2.4016457796e-1f, 5.5799674243e-2f, 9.0171657503e-3f,
                                   1.8671271391e-3f};

inline f32x16 softmax_exp2(f32x16 x) {
  // maskz with every lane kept: GCC 12 warns that the plain forms read an uninitialized register.
  const __m512 r = _mm512_maskz_reduce_ps(0xffff, to_m512(x), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const f32x16 p = exp2_poly(from_m512(r), kExp2PolyUnit);
  return from_m512(_mm512_maskz_scalef_ps(0xffff, to_m512(p), to_m512(x)));
}
#else
// Coefficients: a minimax fit of 2^r in relative error on [-1/2, 1/2], constant term 1.
constexpr float kExp2PolyHalf[] = {6.9314700365e-1f, 2.4022242427e-1f, 5.5507235229e-2f, 9.6715139225e-3f,
                                   1.3267693575e-3f};

inline f32x16 softmax_exp2(f32x16 x) {
  const f32x16 xc = vmax(x, splat(-151.0f));  // keeps NaN (comparisons with NaN are false)
  const f32x16 n = vfloor(xc + 0.5f);
  const f32x16 p = exp2_poly(xc - n, kExp2PolyHalf);
  // 2^n as 2^(n/2) * 2^(n - n/2): each factor stays a normal float for n in [-151, 0].
  const i32x16 ni = __builtin_convertvector(n == n ? n : splat(0.0f), i32x16);
  const i32x16 n1 = ni >> 1, n2 = ni - n1;
  const f32x16 s1 = bits_to_f32(__builtin_convertvector((n1 + 127) << 23, u32x16));
  const f32x16 s2 = bits_to_f32(__builtin_convertvector((n2 + 127) << 23, u32x16));
  const f32x16 y = p * s1 * s2;
  return x != x ? x : y;  // NaN in, NaN out
}
#endif

inline f32x16 lane_index() {
  f32x16 v;
  for (int i = 0; i < kLanes; ++i) v[i] = static_cast<float>(i);
  return v;
}

// Bias values for columns [j, j + n) of one row (n <= 16, missing lanes 0), as float; bool masks become 0
// (attend) or -inf (masked).
template <class T>
inline f32x16 load_bias(const T* p, int n) {
  if constexpr (std::is_same_v<T, bool>) {
    uint8_t bytes[kLanes] = {};
    std::memcpy(bytes, p, static_cast<size_t>(n));
    f32x16 v;
    for (int i = 0; i < kLanes; ++i) v[i] = bytes[i] || i >= n ? 0.0f : -__builtin_inff();
    return v;
  } else {
    return n == kLanes ? load(p) : load_partial(p, n);
  }
}
template <class T>
inline float bias_scalar(const T* p) {
  if constexpr (std::is_same_v<T, bool>)
    return *p ? 0.0f : -__builtin_inff();
  else
    return to_float(*p);
}

inline void store_probabilities(float* p, f32x16 v) {
  store(p, v);
}
inline void store_probabilities(uint16_t* p, f32x16 v) {
#if defined(__AVX512BF16__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
#else
  store(reinterpret_cast<bf16_t*>(p), v);
#endif
}
// Two consecutive vectors: v0 at p, v1 at p + 16. In bf16 one VCVTNE2PS2BF16 rounds both (two uops, where
// a VCVTNEPS2BF16 per vector takes two each).
inline void store_probabilities(float* p, f32x16 v0, f32x16 v1) {
  store(p, v0);
  store(p + kLanes, v1);
}
inline void store_probabilities(uint16_t* p, f32x16 v0, f32x16 v1) {
#if defined(__AVX512BF16__)
  _mm512_storeu_si512(p, (__m512i)_mm512_cvtne2ps_pbh(to_m512(v1), to_m512(v0)));
#else
  store_probabilities(p, v0);
  store_probabilities(p + kLanes, v1);
#endif
}

struct TileState {
  float* scores;  // [rows][key_tile]
  void* probs;    // [rows][key_tile] of the math's element type
  float* acc;     // [rows][dv_pad]
  float* max;     // running max of each row (of the scaled, biased scores)
  float* sum;     // running sum of exp(score - max)
  float* alpha;   // exp(old max - new max): how much this step shrinks earlier contributions
};

// x * c - m, with one rounding where FMA exists.
inline f32x16 mul_sub(f32x16 x, float c, f32x16 m) {
#if defined(__AVX512F__)
  return _mm512_fmsub_ps(x, _mm512_set1_ps(c), m);
#else
  return x * c - m;
#endif
}

// Scores of keys [j0, j0 + nk) (in st.scores, nk_pad columns) -> scaled, biased, masked; updates the
// running max and sum and writes the probabilities exp(s - max) for the P V product.
// Without a bias and with scale > 0 (the usual case), max(s * scale) = max(s) * scale, so pass 1 only
// reads the scores and pass 2 scales them inside the exp's argument; otherwise pass 1 writes the scaled,
// biased scores back. Either way only the vectors holding masked keys (causal, or past the last key) pay
// for the mask. after_row() runs after each row's probabilities (the AMX path issues tile products there).
template <class P, class BiasT, class AfterRow>
void softmax_step(const AttnTileArgs& a, const TileState& st, int64_t j0, int64_t nk, int64_t nk_pad,
                  AfterRow&& after_row) {
  constexpr bool kHasBias = !std::is_void_v<BiasT>;
  const bool scaled_in_exp = !kHasBias && a.scale > 0.0f;
  const float pass1_scale = scaled_in_exp ? 1.0f : a.scale;
  const float pass2_scale = scaled_in_exp ? a.scale : 1.0f;
  const f32x16 lanes = lane_index();
  const f32x16 neg_inf = splat(-__builtin_inff());
  P* probs = static_cast<P*>(st.probs);
  for (int64_t g0 = 0; g0 < a.rows; g0 += kLanes) {
    const int64_t g1 = std::min(a.rows, g0 + kLanes);
    // Pass 1 over each row of the group: the row's lane maxima (of the scaled, biased, masked scores),
    // reduced for the 16 rows at once after the pass: one row's reduction alone is a chain of 15 dependent
    // compares and lane extracts, on which a fifth of the AMX tile kernel's samples sat (attention ran 1-4%
    // faster without them).
    f32x16 lane_max[kLanes];
    for (int64_t i = g0; i < g1; ++i) {
      float* s = st.scores + i * a.key_tile;
      int64_t limit = nk;
      if (a.causal) limit = std::clamp<int64_t>(a.q_first + i - j0 + 1, 0, nk);
      const int64_t unmasked = limit / kLanes * kLanes;
      const f32x16 limit_v = splat(static_cast<float>(limit));
      const BiasT* bias_row = nullptr;
      if constexpr (kHasBias) {
        bias_row = static_cast<const BiasT*>(a.bias) + i * a.bias_row_stride + j0 * a.bias_col_stride;
      }
      auto biased = [&](f32x16 x, int64_t j) {
        if constexpr (kHasBias) {
          if (a.bias_col_stride == 0) {
            x += splat(bias_scalar(bias_row));
          } else if (j < nk) {
            x += load_bias(bias_row + j, static_cast<int>(std::min<int64_t>(kLanes, nk - j)));
          }
        }
        return x;
      };
      f32x16 mx = neg_inf;
      int64_t j = 0;
      if (scaled_in_exp) {
        for (; j < unmasked; j += kLanes) mx = vmax(mx, load(s + j));
      } else {
        for (; j < unmasked; j += kLanes) {
          const f32x16 x = biased(load(s + j) * pass1_scale, j);
          store(s + j, x);
          mx = vmax(mx, x);
        }
      }
      for (; j < nk_pad; j += kLanes) {
        f32x16 x = biased(load(s + j) * pass1_scale, j);
        x = lanes + static_cast<float>(j) < limit_v ? x : neg_inf;
        store(s + j, x);
        mx = vmax(mx, x);
      }
      lane_max[i - g0] = mx;
    }
    for (int64_t i = g1; i < g0 + kLanes; ++i) lane_max[i - g0] = neg_inf;
    const f32x16 maxima = reduce_max_16(lane_max);
    f32x16 old_max = splat(0.0f), new_max = splat(0.0f);
    for (int64_t i = g0; i < g1; ++i) {
      const float m_old = st.max[i];
      const float m_new = std::max(m_old, maxima[i - g0] * pass2_scale);
      st.max[i] = m_new;
      old_max[i - g0] = m_old;
      // While every score so far is masked, subtract 0 so exp(-inf - max) gives 0 instead of NaN.
      new_max[i - g0] = m_new == -__builtin_inff() ? 0.0f : m_new;
    }
    const f32x16 alpha = softmax_exp2((old_max - new_max) * kLog2e);
    // Pass 2: probabilities and their sum (in float, before P is rounded for the product, as torch does);
    // the rows' lane sums are added up for the group at once, as the maxima were.
    f32x16 lane_sum[kLanes];
    for (int64_t i = g0; i < g1; ++i) {
      const float* s = st.scores + i * a.key_tile;
      P* p = probs + i * a.key_tile;
      const f32x16 m = splat(new_max[i - g0] * kLog2e);
      const float c = pass2_scale * kLog2e;
      // Two vectors per iteration with their own sums: two independent chains through the exponential.
      f32x16 sum0 = splat(0.0f), sum1 = splat(0.0f);
      int64_t j = 0;
      for (; j + 2 * kLanes <= nk_pad; j += 2 * kLanes) {
        const f32x16 e0 = softmax_exp2(mul_sub(load(s + j), c, m));
        const f32x16 e1 = softmax_exp2(mul_sub(load(s + j + kLanes), c, m));
        sum0 += e0;
        sum1 += e1;
        store_probabilities(p + j, e0, e1);
      }
      if (j < nk_pad) {
        const f32x16 e = softmax_exp2(mul_sub(load(s + j), c, m));
        sum0 += e;
        store_probabilities(p + j, e);
      }
      st.alpha[i] = alpha[i - g0];
      lane_sum[i - g0] = sum0 + sum1;
      after_row();
    }
    for (int64_t i = g1; i < g0 + kLanes; ++i) lane_sum[i - g0] = splat(0.0f);
    const f32x16 sums = reduce_add_16(lane_sum);
    for (int64_t i = g0; i < g1; ++i) st.sum[i] = st.sum[i] * alpha[i - g0] + sums[i - g0];
  }
}

template <class T>
void store_row(T* out, const float* acc, int64_t n, float factor) {
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) store(out + c, load(acc + c) * factor);
  if (c < n) store_partial(out + c, load(acc + c) * factor, static_cast<int>(n - c));
}

// Calls softmax_step for the bias dtype of the arguments.
template <class P, class AfterRow>
void softmax_for_bias(const AttnTileArgs& a, const TileState& st, int64_t j0, int64_t nk, int64_t nk_pad,
                      AfterRow&& after_row) {
  if (!a.bias)
    softmax_step<P, void>(a, st, j0, nk, nk_pad, after_row);
  else if (a.bias_dtype == float32)
    softmax_step<P, float>(a, st, j0, nk, nk_pad, after_row);
  else if (a.bias_dtype == bfloat16)
    softmax_step<P, bf16_t>(a, st, j0, nk, nk_pad, after_row);
  else if (a.bias_dtype == float16)
    softmax_step<P, f16_t>(a, st, j0, nk, nk_pad, after_row);
  else
    softmax_step<P, bool>(a, st, j0, nk, nk_pad, after_row);
}

// Output rows: the accumulator over the softmax's sum, in the output dtype.
void write_output(const AttnTileArgs& a, const TileState& st) {
  for (int64_t i = 0; i < a.rows; ++i) {
    // A row whose keys were all masked has sum 0 and gives zeros, as torch does.
    const float inv = st.sum[i] > 0.0f ? 1.0f / st.sum[i] : 0.0f;
    const float* acc = st.acc + i * a.dv_pad;
    char* out =
        static_cast<char*>(a.out) + i * a.out_row_stride * static_cast<int64_t>(dtype_size(a.out_dtype));
    if (a.out_dtype == float32)
      store_row(reinterpret_cast<float*>(out), acc, a.dv, inv);
    else if (a.out_dtype == bfloat16)
      store_row(reinterpret_cast<bf16_t*>(out), acc, a.dv, inv);
    else
      store_row(reinterpret_cast<f16_t*>(out), acc, a.dv, inv);
  }
}

// The scratch of one query tile: `buffers` copies of the scores and of the probabilities, then the state.
TileState tile_state(const AttnTileArgs& a, int64_t layout_rows, int buffers) {
  TileState st;
  st.scores = a.scratch;
  st.probs = a.scratch + buffers * layout_rows * a.key_tile;
  st.acc = a.scratch + 2 * buffers * layout_rows * a.key_tile;
  st.max = st.acc + layout_rows * a.dv_pad;
  st.sum = st.max + attn_round_up(a.rows, kAttnBlock);
  st.alpha = st.sum + attn_round_up(a.rows, kAttnBlock);
  std::fill(st.max, st.max + a.rows, -__builtin_inff());
  std::fill(st.sum, st.sum + a.rows, 0.0f);
  return st;
}

// With the causal mask no query of this tile sees keys past its last row.
int64_t keys_seen(const AttnTileArgs& a) {
  return a.causal ? std::min(a.skv, a.q_first + a.rows) : a.skv;
}

// One query tile with the products on vector registers (FMA or VDPBF16PS micro-kernels).
template <class M>
void query_tile(const AttnTileArgs& a) {
  using Elem = typename M::Elem;
  const TileState st = tile_state(a, a.rows, 1);
  const Elem* q = static_cast<const Elem*>(a.q);
  const Elem* k = static_cast<const Elem*>(a.k);
  const Elem* v = static_cast<const Elem*>(a.v);
  const int64_t kv_end = keys_seen(a);
  const int64_t dv_blocks = a.dv_pad / kAttnBlock;
  if (kv_end <= 0) std::fill(st.acc, st.acc + a.rows * a.dv_pad, 0.0f);
  for (int64_t j0 = 0; j0 < kv_end; j0 += a.key_tile) {
    const int64_t nk = std::min(a.key_tile, kv_end - j0);
    const int64_t nk_pad = attn_round_up(nk, kAttnBlock);
    // S = Q K^T for keys [j0, j0 + nk_pad): packed K holds 16-key blocks of d_pad * 16 elements.
    tile_product<M>(a.rows, nk_pad / kAttnBlock, a.d_pad / M::kPair, q, a.d_pad, k + j0 * a.d_pad,
                    a.d_pad * kAttnBlock, st.scores, a.key_tile, nullptr);
    softmax_for_bias<Elem>(a, st, j0, nk, nk_pad, [] {});
    // O = O * alpha + P V; packed V holds 16-column blocks of skv_pad * 16 elements.
    tile_product<M>(a.rows, dv_blocks, nk_pad / M::kPair, static_cast<const Elem*>(st.probs), a.key_tile,
                    v + j0 * kAttnBlock, a.skv_pad * kAttnBlock, st.acc, a.dv_pad,
                    j0 == 0 ? nullptr : st.alpha);
  }
  write_output(a, st);
}

#if defined(__AVX512BF16__)
// One query tile with bf16 products on AMX tiles (the AVX-512 variant only; the driver asks for it only
// there). Rows, D and the keys are padded to whole tile steps (attn_layout_rows, kAttnAmxStep).
//
// The tiles multiply on their own unit while the softmax runs on the vector units, so the key tiles form a
// pipeline: while the softmax of key tile t runs, the AMX unit computes the scores of tile t + 1 and the
// P V product of tile t - 1, a few tile products after each row of the softmax (SteppedProduct). The
// scores and the probabilities are double-buffered for that; every product and every softmax runs as it
// would one after the other, so the results are the same. On an Intel Xeon with AMX (docs/performance.md)
// this is 7-8% faster than the products and the softmax one after the other; the tile multiplies and the
// AVX-512 arithmetic do not run side by side there (interleaved they take longer than the sum of each
// alone), so what it hides is the tiles' loads from L2. Spreading the products more finely (every 8 or 16
// vectors of the softmax) or more coarsely measured the same or slower.
void query_tile_amx(const AttnTileArgs& a) {
  const int64_t layout_rows = attn_layout_rows(a.rows, true);
  const TileState st = tile_state(a, layout_rows, 2);
  float* const scores[2] = {st.scores, st.scores + layout_rows * a.key_tile};
  uint16_t* const probs[2] = {
      static_cast<uint16_t*>(st.probs),
      reinterpret_cast<uint16_t*>(static_cast<float*>(st.probs) + layout_rows * a.key_tile)};
  // The padding rows' probabilities multiply V too: zeros, so that they add nothing anywhere.
  for (uint16_t* p : probs) std::fill(p + a.rows * a.key_tile, p + layout_rows * a.key_tile, uint16_t{0});
  load_amx_tile_config();

  const int64_t kv_end = keys_seen(a);
  const int64_t tiles = (kv_end + a.key_tile - 1) / a.key_tile;
  const int64_t row_tiles = layout_rows / amx::kTileRows;
  auto keys_of = [&](int64_t t) { return std::min(a.key_tile, kv_end - t * a.key_tile); };
  auto padded_keys_of = [&](int64_t t) { return attn_round_up(keys_of(t), kAttnAmxStep); };
  // S = Q K^T for key tile t: packed K holds 16-key blocks of d_pad * 16 elements.
  auto scores_of = [&](int64_t t) {
    return amx::SteppedProduct(row_tiles, padded_keys_of(t) / amx::kTileCols, a.d_pad / amx::kTileK,
                               static_cast<const uint16_t*>(a.q), a.d_pad,
                               static_cast<const uint16_t*>(a.k) + t * a.key_tile * a.d_pad,
                               a.d_pad * kAttnBlock, scores[t % 2], a.key_tile, false);
  };
  // O (+)= P V for key tile t: packed V holds 16-column blocks of skv_pad * 16 elements.
  auto values_of = [&](int64_t t) {
    return amx::SteppedProduct(row_tiles, a.dv_pad / amx::kTileCols, padded_keys_of(t) / amx::kTileK,
                               probs[t % 2], a.key_tile,
                               static_cast<const uint16_t*>(a.v) + t * a.key_tile * kAttnBlock,
                               a.skv_pad * kAttnBlock, st.acc, a.dv_pad, t > 0);
  };
  // O *= alpha row by row, before the tiles accumulate onto O as it is in memory.
  auto rescale_output = [&] {
    for (int64_t i = 0; i < a.rows; ++i) {
      float* o = st.acc + i * a.dv_pad;
      const float alpha = st.alpha[i];
      for (int64_t c = 0; c < a.dv_pad; c += kLanes) store(o + c, load(o + c) * alpha);
    }
  };

  if (tiles == 0) std::fill(st.acc, st.acc + a.rows * a.dv_pad, 0.0f);
  if (tiles > 0) scores_of(0).finish();
  for (int64_t t = 0; t < tiles; ++t) {
    amx::SteppedProduct values, next_scores;
    if (t > 0) {
      if (t > 1) rescale_output();  // by tile t - 1's alpha, before tile t's softmax replaces it
      values = values_of(t - 1);
    }
    if (t + 1 < tiles) next_scores = scores_of(t + 1);
    const int64_t per_row = (values.remaining() + next_scores.remaining() + a.rows - 1) / a.rows;
    TileState here = st;
    here.scores = scores[t % 2];
    here.probs = probs[t % 2];
    softmax_for_bias<uint16_t>(a, here, t * a.key_tile, keys_of(t), padded_keys_of(t), [&] {
      const int64_t budget = per_row - values.advance(per_row);
      if (budget > 0) next_scores.advance(budget);
    });
    values.finish();
    next_scores.finish();
  }
  if (tiles > 0) {
    if (tiles > 1) rescale_output();
    values_of(tiles - 1).finish();
  }
  amx::release_tiles();
  write_output(a, st);
}
#endif

}  // namespace

void attn_pack_rows(const AttnMatrix& src, AttnMath math, void* dst, int64_t cols_pad) {
  visit_packing(math, src.dtype, [&](auto out, auto in) {
    pack_rows_as<decltype(out), decltype(in)>(src, static_cast<decltype(out)*>(dst), cols_pad);
  });
}

void attn_pack_keys(const AttnMatrix& src, AttnMath math, void* dst, int64_t rows_pad, int64_t cols_pad) {
  visit_packing(math, src.dtype, [&](auto out, auto in) {
    pack_keys_as<decltype(out), decltype(in)>(src, static_cast<decltype(out)*>(dst), rows_pad, cols_pad);
  });
}

void attn_pack_values(const AttnMatrix& src, AttnMath math, void* dst, int64_t rows_pad, int64_t cols_pad) {
  visit_packing(math, src.dtype, [&](auto out, auto in) {
    pack_values_as<decltype(out), decltype(in)>(src, static_cast<decltype(out)*>(dst), rows_pad, cols_pad);
  });
}

void attn_softmax_exp2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(y + i, softmax_exp2(load(x + i)));
  if (i < n)
    store_partial(y + i, softmax_exp2(load_partial(x + i, static_cast<int>(n - i))), static_cast<int>(n - i));
}

void attn_query_tile(const AttnTileArgs& args) {
#if defined(__AVX512BF16__)
  if (args.amx && args.math == AttnMath::BF16) return query_tile_amx(args);
#endif
  if (args.math == AttnMath::BF16)
    query_tile<Bf16Math>(args);
  else
    query_tile<F32Math>(args);
}

}  // namespace kiln::cpu_kernels::KILN_ISA
