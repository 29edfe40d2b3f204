// The linear epilogue on rows of float32 accumulators (see linear_epilogue.h), 16 columns at a time.
#include "backends/cpu/linear_epilogue.h"

#include <algorithm>

#include "backends/cpu/isa/elementwise_math.h"
#include "backends/cpu/isa/vec.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {

// Up to 16 values of a row of `dtype` starting at element `i`.
f32x16 load_any(const void* base, DType dtype, int64_t i, int n) {
  switch (dtype) {
    case DType::BFloat16: {
      const bf16_t* p = static_cast<const bf16_t*>(base) + i;
      return n == kLanes ? load(p) : load_partial(p, n);
    }
    case DType::Float16: {
      const f16_t* p = static_cast<const f16_t*>(base) + i;
      return n == kLanes ? load(p) : load_partial(p, n);
    }
    default: {
      const float* p = static_cast<const float*>(base) + i;
      return n == kLanes ? load(p) : load_partial(p, n);
    }
  }
}

void store_any(void* base, DType dtype, int64_t i, f32x16 v, int n) {
  switch (dtype) {
    case DType::BFloat16: {
      bf16_t* p = static_cast<bf16_t*>(base) + i;
      return n == kLanes ? store(p, v) : store_partial(p, v, n);
    }
    case DType::Float16: {
      f16_t* p = static_cast<f16_t*>(base) + i;
      return n == kLanes ? store(p, v) : store_partial(p, v, n);
    }
    default: {
      float* p = static_cast<float*>(base) + i;
      return n == kLanes ? store(p, v) : store_partial(p, v, n);
    }
  }
}

f32x16 activate(Activation act, f32x16 x) {
  switch (act) {
    case Activation::Gelu:
      return act_gelu(x);
    case Activation::GeluTanh:
      return act_gelu_tanh(x);
    case Activation::Silu:
      return act_silu(x);
    case Activation::None:
      break;
  }
  return x;
}

}  // namespace

void linear_epilogue_rows(const float* acc, int64_t acc_stride, int64_t m0, int64_t rows, int64_t n0,
                          int64_t cols, const LinearEpilogueArgs& e, void* out, DType out_dtype,
                          int64_t out_row_stride) {
  const int64_t rows_per_gate = e.gate != nullptr && e.gate_rows > 1 ? e.m / e.gate_rows : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = m0 + r;
    const float* a = acc + r * acc_stride;
    int64_t gate_base = 0;
    if (e.gate != nullptr) gate_base = (rows_per_gate > 0 ? row / rows_per_gate : 0) * e.gate_row_stride;
    for (int64_t c = 0; c < cols; c += kLanes) {
      const int n = static_cast<int>(std::min<int64_t>(kLanes, cols - c));
      const int64_t col = n0 + c;
      f32x16 v = n == kLanes ? load(a + c) : load_partial(a + c, n);
      if (e.bias != nullptr) v += load_any(e.bias, e.bias_dtype, col, n);
      if (e.add_output) v += load_any(out, out_dtype, row * out_row_stride + col, n);
      v = activate(e.act, v);
      if (e.gate != nullptr) {
        if (e.gate_cols == 1)
          v *= load_any(e.gate, e.gate_dtype, gate_base, 1)[0];
        else
          v *= load_any(e.gate, e.gate_dtype, gate_base + col, n);
      }
      if (e.residual != nullptr)
        v += load_any(e.residual, e.residual_dtype, row * e.residual_row_stride + col, n);
      store_any(out, out_dtype, row * out_row_stride + col, v, n);
    }
  }
}

}  // namespace kiln::cpu_kernels::KILN_ISA
