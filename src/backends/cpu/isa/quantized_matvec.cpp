// The product of a few rows of activations with a block-quantized weight (the FLUX modulation and embedding
// linears run on one row per image): each weight row is dequantized once into a cache-resident buffer and
// dotted with every activation row, so the weight is read once, at its quantized size, and never written
// out expanded. Built per ISA like every kernel in this folder.
#include <type_traits>
#include <vector>

#include "backends/cpu/isa/vec.h"
#include "kiln/quant/storage_type.h"

namespace kiln::cpu_kernels::KILN_ISA {

void dequantize_row_f32(quant::StorageType type, const void* src, float* dst, int64_t n);
void dequantize_row_bf16(quant::StorageType type, const void* src, bf16_t* dst, int64_t n);

namespace {

float widen(float v) {
  return v;
}
float widen(bf16_t v) {
  return bf16_to_f32(v);
}

template <class W>
float dot(const float* a, const W* b, int64_t k) {
  f32x16 acc0{}, acc1{};
  int64_t i = 0;
  for (; i + 2 * kLanes <= k; i += 2 * kLanes) {
    acc0 += load(a + i) * load(b + i);
    acc1 += load(a + i + kLanes) * load(b + i + kLanes);
  }
  for (; i + kLanes <= k; i += kLanes) acc0 += load(a + i) * load(b + i);
  acc0 += acc1;
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc0[l];
  for (; i < k; ++i) s += a[i] * widen(b[i]);
  return s;
}

template <class W>
void matvec_rows(quant::StorageType type, const uint8_t* w, int64_t row_bytes, int64_t n, const float* x,
                 int64_t m, int64_t k, const float* bias, void* out, bool out_bf16) {
#pragma omp parallel
  {
    std::vector<W> row(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t j = 0; j < n; ++j) {
      if constexpr (std::is_same_v<W, float>)
        dequantize_row_f32(type, w + j * row_bytes, row.data(), k);
      else
        dequantize_row_bf16(type, w + j * row_bytes, row.data(), k);
      for (int64_t r = 0; r < m; ++r) {
        float s = dot(x + r * k, row.data(), k);
        if (bias != nullptr) s += bias[j];
        if (out_bf16)
          static_cast<bf16_t*>(out)[r * n + j] = f32_to_bf16(s);
        else
          static_cast<float*>(out)[r * n + j] = s;
      }
    }
  }
}

}  // namespace

// out[r, j] = sum_k x[r, k] w[j, k] + bias[j] for r < m, j < n; x float32 [m, k] dense; w block-quantized
// rows of row_bytes; bias float32 or null. With round_weights the dequantized weights are first rounded to
// bfloat16 (the values a bfloat16 GEMM multiplies). out is float32 or (out_bf16) bfloat16, [m, n] dense,
// rounded once.
void quantized_matvec(quant::StorageType type, const uint8_t* w, int64_t row_bytes, int64_t n, const float* x,
                      int64_t m, int64_t k, bool round_weights, const float* bias, void* out, bool out_bf16) {
  if (round_weights)
    matvec_rows<bf16_t>(type, w, row_bytes, n, x, m, k, bias, out, out_bf16);
  else
    matvec_rows<float>(type, w, row_bytes, n, x, m, k, bias, out, out_bf16);
}

}  // namespace kiln::cpu_kernels::KILN_ISA
