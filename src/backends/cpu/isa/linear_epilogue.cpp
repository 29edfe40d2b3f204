// The linear epilogue on rows of float32 accumulators (see linear_epilogue.h), 16 columns at a time.
#include "backends/cpu/linear_epilogue.h"

#include <algorithm>

#include "backends/cpu/isa/elementwise_math.h"
#include "backends/cpu/isa/vec.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {

// Each step runs over a whole row of accumulators (at most a block's width, in L1) in place, with the dtype
// and the activation chosen once per row rather than once per vector: per vector, the switch, the calls and
// the spilled loop state cost more than the arithmetic, about a tenth of a DiT step on AMX.

// a[c] = op(a[c], p[c]) for c < n.
template <class T, class Op>
void combine_row(float* a, const T* p, int64_t n, Op op) {
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) store(a + c, op(load(a + c), load(p + c)));
  if (c < n) {
    const int tail = static_cast<int>(n - c);
    store_partial(a + c, op(load_partial(a + c, tail), load_partial(p + c, tail)), tail);
  }
}

// Calls f with `base` as a pointer to its dtype (float32, bfloat16 or float16), offset by `i` elements.
template <class F>
void with_typed(const void* base, DType dtype, int64_t i, F&& f) {
  switch (dtype) {
    case DType::BFloat16:
      return f(static_cast<const bf16_t*>(base) + i);
    case DType::Float16:
      return f(static_cast<const f16_t*>(base) + i);
    default:
      return f(static_cast<const float*>(base) + i);
  }
}

void add_any(float* a, const void* base, DType dtype, int64_t i, int64_t n) {
  with_typed(base, dtype, i, [&](auto p) { combine_row(a, p, n, [](f32x16 x, f32x16 y) { return x + y; }); });
}

float scalar_any(const void* base, DType dtype, int64_t i) {
  float v = 0.0f;
  with_typed(base, dtype, i, [&](auto p) { v = load_partial(p, 1)[0]; });
  return v;
}

template <class F>
void map_row(float* a, int64_t n, F f) {
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) store(a + c, f(load(a + c)));
  if (c < n) {
    const int tail = static_cast<int>(n - c);
    store_partial(a + c, f(load_partial(a + c, tail)), tail);
  }
}

void activate(float* a, int64_t n, Activation act) {
  switch (act) {
    case Activation::Gelu:
      return map_row(a, n, [](f32x16 x) { return act_gelu(x); });
    case Activation::GeluTanh:
      return map_row(a, n, [](f32x16 x) { return act_gelu_tanh(x); });
    case Activation::Silu:
      return map_row(a, n, [](f32x16 x) { return act_silu(x); });
    case Activation::None:
      return;
  }
}

template <class T>
void store_row(T* out, const float* a, int64_t n) {
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) store(out + c, load(a + c));
  if (c < n) store_partial(out + c, load_partial(a + c, static_cast<int>(n - c)), static_cast<int>(n - c));
}

void store_any(void* base, DType dtype, int64_t i, const float* a, int64_t n) {
  switch (dtype) {
    case DType::BFloat16:
      return store_row(static_cast<bf16_t*>(base) + i, a, n);
    case DType::Float16:
      return store_row(static_cast<f16_t*>(base) + i, a, n);
    default:
      return store_row(static_cast<float*>(base) + i, a, n);
  }
}

}  // namespace

void linear_epilogue_rows(float* acc, int64_t acc_stride, int64_t m0, int64_t rows, int64_t n0, int64_t cols,
                          const LinearEpilogueArgs& e, void* out, DType out_dtype, int64_t out_row_stride) {
  const int64_t rows_per_gate = e.gate != nullptr && e.gate_rows > 1 ? e.m / e.gate_rows : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = m0 + r;
    float* a = acc + r * acc_stride;
    if (e.bias != nullptr) add_any(a, e.bias, e.bias_dtype, n0, cols);
    if (e.add_output) add_any(a, out, out_dtype, row * out_row_stride + n0, cols);
    activate(a, cols, e.act);
    if (e.gate != nullptr) {
      const int64_t gate_base = (rows_per_gate > 0 ? row / rows_per_gate : 0) * e.gate_row_stride;
      if (e.gate_cols == 1) {
        const float g = scalar_any(e.gate, e.gate_dtype, gate_base);
        map_row(a, cols, [g](f32x16 x) { return x * g; });
      } else {
        with_typed(e.gate, e.gate_dtype, gate_base + n0,
                   [&](auto p) { combine_row(a, p, cols, [](f32x16 x, f32x16 y) { return x * y; }); });
      }
    }
    if (e.residual != nullptr)
      add_any(a, e.residual, e.residual_dtype, row * e.residual_row_stride + n0, cols);
    store_any(out, out_dtype, row * out_row_stride + n0, a, cols);
  }
}

}  // namespace kiln::cpu_kernels::KILN_ISA
