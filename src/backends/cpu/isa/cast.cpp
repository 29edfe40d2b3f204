// Vectorized contiguous conversions between float32, bfloat16 and float16 for the "copy" kernel
// (backends/cpu/copy.cpp). bfloat16 models cast activations and weights constantly, and the scalar loop
// (one branchy RNE conversion per element) runs well below memory speed.
#include "backends/cpu/isa/vec.h"
#include "kiln/core/dtype.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {

template <class From, class To>
void convert(const From* __restrict src, To* __restrict dst, int64_t n) {
  int64_t i = 0;
  // Two vectors per iteration keep both load/convert chains busy.
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const f32x16 a = load(src + i), b = load(src + i + kLanes);
    store(dst + i, a);
    store(dst + i + kLanes, b);
  }
  for (; i + kLanes <= n; i += kLanes) store(dst + i, load(src + i));
  if (i < n) store_partial(dst + i, load_partial(src + i, static_cast<int>(n - i)), static_cast<int>(n - i));
}

template <class From>
bool convert_from(const From* src, void* dst, DType to, int64_t n) {
  switch (to) {
    case DType::Float32:
      convert(src, static_cast<float*>(dst), n);
      return true;
    case DType::BFloat16:
      convert(src, static_cast<bf16_t*>(dst), n);
      return true;
    case DType::Float16:
      convert(src, static_cast<f16_t*>(dst), n);
      return true;
    default:
      return false;
  }
}

}  // namespace

// Converts n contiguous elements; returns false (doing nothing) unless both dtypes are float32, bfloat16 or
// float16 and differ. Rounding is RNE with NaNs kept, identical to the scalar conversions in
// kiln/core/half.h.
bool cast_contiguous(const void* src, DType from, void* dst, DType to, int64_t n) {
  if (from == to) return false;
  switch (from) {
    case DType::Float32:
      return convert_from(static_cast<const float*>(src), dst, to, n);
    case DType::BFloat16:
      return convert_from(static_cast<const bf16_t*>(src), dst, to, n);
    case DType::Float16:
      return convert_from(static_cast<const f16_t*>(src), dst, to, n);
    default:
      return false;
  }
}

}  // namespace kiln::cpu_kernels::KILN_ISA
