// Quantizers for the benchmarks: bf16 or float32 weights written as GGUF blocks or fp8, as a GGUF or an fp8
// safetensors file would hold them, so that a benchmark's weights stay quantized through load_quantized
// (gguf_step.cpp) or go to linear as a QuantizedTensor (matmul.cpp). Q8_0 rounds as ggml's reference
// quantizer does; Q4_K is a plain min/max quantizer per 32-element sub-block (the layout ggml reads, not
// ggml's search for the best scales); F8_E4M3 rounds to nearest (ties away from zero), saturating at 448.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kiln/core/half.h"
#include "kiln/core/tensor.h"
#include "kiln/quant/quantized_tensor.h"

namespace kiln::bench {

inline void put_half(uint8_t* p, float v) {
  const kiln::f16_t h = kiln::f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// ggml's quantize_row_q8_0_ref: d = amax / 127, q = round(x / d).
inline void quantize_q8_0(const float* x, uint8_t* out, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b, x += 32, out += 34) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127, id = d != 0 ? 1 / d : 0;
    put_half(out, d);
    for (int i = 0; i < 32; ++i)
      out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[i] * id)));
  }
}

// Q4_K: per 32-element sub-block scale (max - min) / 15 and min, both as 6-bit multiples of float16
// super-scales.
inline void quantize_q4_k(const float* x, uint8_t* out, int64_t k) {
  for (int64_t b = 0; b < k / 256; ++b, x += 256, out += 144) {
    float sc[8], mn[8], max_sc = 0, max_mn = 0;
    for (int j = 0; j < 8; ++j) {
      float lo = 0, hi = -1e30f;
      for (int i = 0; i < 32; ++i) lo = std::min(lo, x[32 * j + i]), hi = std::max(hi, x[32 * j + i]);
      sc[j] = (hi - lo) / 15;
      mn[j] = -lo;
      max_sc = std::max(max_sc, sc[j]);
      max_mn = std::max(max_mn, mn[j]);
    }
    const float d = kiln::f16_to_f32(kiln::f32_to_f16(max_sc / 63));
    const float dmin = kiln::f16_to_f32(kiln::f32_to_f16(max_mn / 63));
    put_half(out, d);
    put_half(out + 2, dmin);
    uint8_t qs[8], qm[8];
    for (int j = 0; j < 8; ++j) {
      qs[j] = static_cast<uint8_t>(std::clamp(d > 0 ? std::lround(sc[j] / d) : 0L, 0L, 63L));
      qm[j] = static_cast<uint8_t>(std::clamp(dmin > 0 ? std::lround(mn[j] / dmin) : 0L, 0L, 63L));
    }
    uint8_t* s = out + 4;
    for (int j = 0; j < 4; ++j) {
      s[j] = static_cast<uint8_t>((qs[j] & 63) | ((qs[j + 4] >> 4) << 6));
      s[j + 4] = static_cast<uint8_t>((qm[j] & 63) | ((qm[j + 4] >> 4) << 6));
      s[j + 8] = static_cast<uint8_t>((qs[j + 4] & 15) | ((qm[j + 4] & 15) << 4));
    }
    uint8_t* q = out + 16;
    std::memset(q, 0, 128);
    for (int j = 0; j < 8; ++j) {
      const float step = d * qs[j], offset = dmin * qm[j];
      for (int i = 0; i < 32; ++i) {
        const long v = step > 0 ? std::lround((x[32 * j + i] + offset) / step) : 0;
        q[32 * (j / 2) + i] |= static_cast<uint8_t>(std::clamp(v, 0L, 15L) << (4 * (j % 2)));
      }
    }
  }
}

// float8_e4m3fn's byte for x: 3 mantissa bits, exponent bias 7, subnormals below 2^-6, largest 448.
inline uint8_t to_fp8_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::min(std::fabs(x), 448.0f);
  if (a < 0x1p-6f) return sign | static_cast<uint8_t>(std::lround(a * 0x1p9f));  // 8 rounds up to 2^-6
  int e = 0;
  const float f = std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  long m = std::lround((f * 2 - 1) * 8);
  if (m == 8) m = 0, ++e;
  return sign | static_cast<uint8_t>(std::min(((e - 1 + 7) << 3) | static_cast<int>(m), 0x7e));
}

// A float32 [n, k] weight as Q8_0 or Q4_K blocks (k a multiple of the block size) or as F8_E4M3 bytes.
inline quant::QuantizedTensor quantize_weight(const Tensor& w, quant::StorageType type) {
  const int64_t n = w.size(0), k = w.size(1);
  const std::vector<float> v = w.to(float32).to_vector<float>();
  const int64_t rb = quant::row_bytes(type, k);
  std::vector<uint8_t> bytes(static_cast<size_t>(n * rb));
  for (int64_t r = 0; r < n; ++r) {
    if (type == quant::StorageType::F8_E4M3)
      for (int64_t i = 0; i < k; ++i)
        bytes[static_cast<size_t>(r * rb + i)] = to_fp8_e4m3(v[static_cast<size_t>(r * k + i)]);
    else if (type == quant::StorageType::Q8_0)
      quantize_q8_0(v.data() + r * k, bytes.data() + r * rb, k);
    else
      quantize_q4_k(v.data() + r * k, bytes.data() + r * rb, k);
  }
  return {Tensor::from_vector(bytes, {n, rb}), type, {n, k}};
}

}  // namespace kiln::bench
