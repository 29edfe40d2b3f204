// Dequantization of ggml block formats and widening of fp8 (see kiln/quant/storage_type.h), built once per
// ISA like every kernel in this folder. Each block is expanded into float32 exactly as gguf-py's numpy code
// does it (same products and sums in the same order; -ffp-contract=off keeps them unfused), so both builds
// give gguf's bits.
// The loops over a block's elements have fixed trip counts and no branches, which GCC vectorizes: 512-bit
// in the avx512 build, SSE in the generic one.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backends/cpu/isa/vec.h"
#include "kiln/quant/storage_type.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {

using quant::StorageType;

constexpr int kQK = 32;    // elements per block of the legacy formats
constexpr int kQKK = 256;  // elements per K-quant super-block

float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_to_f32(f16_t{bits});
}

// Q4_0: f16 d, 16 bytes of nibbles; element j is the low nibble of byte j, element j + 16 the high one.
void q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// Q4_1: f16 d, f16 m, nibbles as Q4_0; y = d * q + m.
void q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// Q5_0: f16 d, a little-endian uint32 of fifth bits (bit j for element j), nibbles as Q4_0.
void q5_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

// Q5_1: f16 d, f16 m, fifth bits and nibbles as Q5_0; y = d * q + m.
void q5_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

// Q8_0: f16 d, 32 int8.
void q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// Q2_K: 16 scale bytes (low nibble scale, high nibble min, per 16 elements), 64 bytes of 2-bit values,
// f16 d, f16 dmin. Element 128 h + 32 s + l is bits 2s..2s+1 of byte 32 h + l.
void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  for (int g = 0; g < 16; ++g) {
    const float dl = d * static_cast<float>(scales[g] & 0x0f);
    const float ml = dmin * static_cast<float>(scales[g] >> 4);
    const int h = g / 8, s = (g / 2) % 4, l0 = (g % 2) * 16;
    for (int l = 0; l < 16; ++l) {
      const int q = (qs[32 * h + l0 + l] >> (2 * s)) & 3;
      y[16 * g + l] = dl * static_cast<float>(q) - ml;
    }
  }
}

// Q3_K: 32 bytes of high-bit masks, 64 bytes of 2-bit values, 12 bytes of 6-bit scales, f16 d. Element
// 128 h + 32 s + l takes bits 2s..2s+1 of byte 32 h + l, and its high bit is bit (4 h + s) of mask byte l;
// a clear high bit subtracts 4.
void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = half_at(b + 108);
  for (int g = 0; g < 16; ++g) {
    const int low = g < 8 ? (sc[g] & 0x0f) : (sc[g - 8] >> 4);
    const int high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
    const float dl = d * static_cast<float>(static_cast<int8_t>(low | (high << 4)) - 32);
    const int h = g / 8, s = (g / 2) % 4, l0 = (g % 2) * 16;
    for (int l = 0; l < 16; ++l) {
      const int ql = (qs[32 * h + l0 + l] >> (2 * s)) & 3;
      const int hbit = (hmask[l0 + l] >> (4 * h + s)) & 1;
      y[16 * g + l] = dl * static_cast<float>(ql - ((hbit ^ 1) << 2));
    }
  }
}

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block (12 packed bytes).
void scale_min_k4(int j, const uint8_t* s, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 0x3f;
    *min = s[j + 4] & 0x3f;
  } else {
    *scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30);
    *min = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}

// Q4_K: f16 d, f16 dmin, 12 scale bytes, 128 bytes of nibbles; sub-block j (32 elements) reads the low
// (even j) or high (odd j) nibbles of bytes 32 (j / 2) ...; y = (d * scale) * q - dmin * min.
void q4_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    scale_min_k4(j, scales, &sc, &m);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) y[32 * j + l] = dl * static_cast<float>((q[l] >> shift) & 0x0f) - ml;
  }
}

// Q5_K: as Q4_K with 32 bytes of fifth bits before the nibbles (bit j of byte l for sub-block j).
void q5_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    scale_min_k4(j, scales, &sc, &m);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0f) | (((qh[l] >> j) & 1) << 4);
      y[32 * j + l] = dl * static_cast<float>(v) - ml;
    }
  }
}

// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales, f16 d. Element 128 h + 32 s + l
// takes nibble (s / 2) of byte 64 h + 32 (s % 2) + l and bits 2s..2s+1 of byte 32 h + l of the highs.
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int g = 0; g < 16; ++g) {
    const float dl = d * static_cast<float>(scales[g]);
    const int h = g / 8, s = (g / 2) % 4, l0 = (g % 2) * 16;
    for (int l = 0; l < 16; ++l) {
      const int lo = (ql[64 * h + 32 * (s % 2) + l0 + l] >> (4 * (s / 2))) & 0x0f;
      const int hi = (qh[32 * h + l0 + l] >> (2 * s)) & 3;
      y[16 * g + l] = dl * static_cast<float>((lo | (hi << 4)) - 32);
    }
  }
}

// Expands one block of the type into its traits' block_size floats.
using BlockFn = void (*)(const uint8_t*, float*);

// The type's block kernel; null for the plain types. Block sizes and bytes come from quant::traits.
constexpr BlockFn block_fn(StorageType type) {
  switch (type) {
    case StorageType::Q4_0:
      return q4_0;
    case StorageType::Q4_1:
      return q4_1;
    case StorageType::Q5_0:
      return q5_0;
    case StorageType::Q5_1:
      return q5_1;
    case StorageType::Q8_0:
      return q8_0;
    case StorageType::Q2_K:
      return q2_k;
    case StorageType::Q3_K:
      return q3_k;
    case StorageType::Q4_K:
      return q4_k;
    case StorageType::Q5_K:
      return q5_k;
    case StorageType::Q6_K:
      return q6_k;
    default:
      return nullptr;
  }
}

// A type added to quant::kStorageTypes needs a kernel here, and a kernel here a row in that table; the block
// kernels expand kQK or kQKK elements (and the bfloat16 path's chunk holds a whole number of either), fp8
// rows go element by element.
constexpr bool kernels_match_the_type_table() {
  for (const quant::StorageTypeTraits& t : quant::kStorageTypes) {
    if (quant::is_fp8(t.type)) {
      if (!t.is_quantized || t.block_size != 1 || t.type_size != 1) return false;
      continue;
    }
    if (t.is_quantized != (block_fn(t.type) != nullptr)) return false;
    if (t.is_quantized && t.block_size != kQK && t.block_size != kQKK) return false;
  }
  return true;
}
static_assert(kernels_match_the_type_table(),
              "every quantized type of quant::kStorageTypes needs a dequantize kernel of its block size");

// 16 fp8 values (one byte each, in the low bits of each lane) as the floats they are, exactly, as torch
// converts them. With e exponent bits (bias 2^(e-1) - 1) and m mantissa bits, the magnitude's bits shifted
// to float32's mantissa position and rebiased give every normal value; subnormals (exponent 0) are their
// mantissa times 2^(1 - bias - m). e4m3fn has no infinity and one NaN pattern per sign (all ones); e5m2 has
// IEEE's infinities and NaNs (exponent all ones).
template <StorageType Type>
f32x16 widen_fp8(u32x16 byte) {
  constexpr int kMant = Type == StorageType::F8_E4M3 ? 3 : 2;
  constexpr int kBias = Type == StorageType::F8_E4M3 ? 7 : 15;
  const u32x16 mag = byte & 0x7fu;
  const u32x16 normal = (mag << (23 - kMant)) + static_cast<uint32_t>((127 - kBias) << 23);
  const f32x16 sub =
      __builtin_convertvector(mag, f32x16) * (1.0f / static_cast<float>(1 << (kBias - 1 + kMant)));
  u32x16 bits = (mag >> kMant) == 0 ? f32_to_bits(sub) : normal;
  if constexpr (Type == StorageType::F8_E4M3) {
    bits = mag == 0x7fu ? u32x16{} + 0x7fc00000u : bits;
  } else {
    const u32x16 special = (mag & 0x03u) == 0 ? u32x16{} + 0x7f800000u : u32x16{} + 0x7fc00000u;
    bits = (mag >> kMant) == 0x1fu ? special : bits;
  }
  return bits_to_f32(bits | ((byte & 0x80u) << 24));
}

template <StorageType Type, class Out>
void fp8_row_as(const uint8_t* src, Out* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    uint8_t bytes[kLanes];
    std::memcpy(bytes, src + i, sizeof bytes);
    u32x16 b;
    for (int l = 0; l < kLanes; ++l) b[l] = bytes[l];
    store(dst + i, widen_fp8<Type>(b));
  }
  if (i < n) {
    u32x16 b{};
    for (int64_t l = 0; l < n - i; ++l) b[l] = src[i + l];
    store_partial(dst + i, widen_fp8<Type>(b), static_cast<int>(n - i));
  }
}

// Every fp8 value is exactly a bfloat16 (and a normal float32: no subnormal reaches VCVTNEPS2BF16), so the
// bfloat16 rows are the float32 ones rounded without loss.
template <class Out>
void fp8_row(StorageType type, const uint8_t* src, Out* dst, int64_t n) {
  if (type == StorageType::F8_E4M3)
    fp8_row_as<StorageType::F8_E4M3>(src, dst, n);
  else
    fp8_row_as<StorageType::F8_E5M2>(src, dst, n);
}

float to_float(float v) {
  return v;
}
float to_float(bf16_t v) {
  return bf16_to_f32(v);
}
float to_float(f16_t v) {
  return f16_to_f32(v);
}

// F32/F16/BF16 rows: plain conversions (the source may be unaligned, so elements are copied out first).
template <class In, class Out>
void convert_row(const uint8_t* src, Out* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    In tmp[kLanes];
    std::memcpy(tmp, src + i * sizeof(In), sizeof tmp);
    store(dst + i, load(tmp));
  }
  for (; i < n; ++i) {
    In v;
    std::memcpy(&v, src + i * sizeof(In), sizeof v);
    if constexpr (std::is_same_v<Out, float>)
      dst[i] = to_float(v);
    else
      dst[i] = f32_to_bf16(to_float(v));
  }
}

template <class Out>
void plain_row(StorageType type, const uint8_t* src, Out* dst, int64_t n) {
  switch (type) {
    case StorageType::F32:
      return convert_row<float>(src, dst, n);
    case StorageType::F16:
      return convert_row<f16_t>(src, dst, n);
    default:
      return convert_row<bf16_t>(src, dst, n);
  }
}

// Rounds n (a multiple of 16) floats to bfloat16, nearest even, NaNs kept quiet. VCVTNEPS2BF16 rounds so too
// but treats subnormal inputs as zero; dequantized values are never subnormal (the smallest nonzero one is a
// float16 scale's 2^-24 times an integer, or a difference of such products, far above 2^-126), so both
// paths give the bits of kiln::f32_to_bf16.
void to_bf16(const float* src, bf16_t* dst, int64_t n) {
#if defined(__AVX512BF16__)
  for (int64_t j = 0; j < n; j += kLanes) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + j));
    std::memcpy(dst + j, &h, sizeof h);
  }
#else
  for (int64_t j = 0; j < n; j += kLanes) store(dst + j, load(src + j));
#endif
}

}  // namespace

// n is a multiple of the type's block size (checked by the caller, kiln::quant::dequantize_row).
void dequantize_row_f32(StorageType type, const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  const quant::StorageTypeTraits& t = quant::traits(type);
  if (!t.is_quantized) return plain_row(type, p, dst, n);
  if (quant::is_fp8(type)) return fp8_row(type, p, dst, n);
  const BlockFn fn = block_fn(type);
  for (int64_t i = 0; i < n; i += t.block_size, p += t.type_size) fn(p, dst + i);
}

void dequantize_row_bf16(StorageType type, const void* src, bf16_t* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  const quant::StorageTypeTraits& t = quant::traits(type);
  if (!t.is_quantized) return plain_row(type, p, dst, n);
  if (quant::is_fp8(type)) return fp8_row(type, p, dst, n);
  const BlockFn fn = block_fn(type);
  // Blocks are expanded into a float chunk and converted once the chunk is full: reading each block back
  // right after its (narrower) stores would stall on store forwarding (4x slower on Zen 4).
  constexpr int64_t kChunk = 1024;  // a whole number of blocks of every format
  alignas(64) float chunk[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    for (int64_t j = 0; j < len; j += t.block_size, p += t.type_size) fn(p, chunk + j);
    to_bf16(chunk, dst + i, len);
  }
}

}  // namespace kiln::cpu_kernels::KILN_ISA
