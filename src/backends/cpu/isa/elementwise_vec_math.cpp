// Exposes the vector math functions of vec.h over arrays, in both ISA variants, so that
// tests/ops/vec_math_test.cpp can measure their accuracy against double-precision references.
#include "backends/cpu/isa/vec.h"

namespace kiln::cpu_kernels::KILN_ISA {

namespace {
template <class F>
void map(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(y + i, f(load(x + i)));
  if (i < n) store_partial(y + i, f(load_partial(x + i, static_cast<int>(n - i))), static_cast<int>(n - i));
}
}  // namespace

// which: 0 log, 1 tanh, 2 erf, 3 sigmoid, 4 sqrt.
void vec_math_f32(int which, const float* x, float* y, int64_t n) {
  switch (which) {
    case 0:
      return map(x, y, n, [](f32x16 v) { return vlog(v); });
    case 1:
      return map(x, y, n, [](f32x16 v) { return vtanh(v); });
    case 2:
      return map(x, y, n, [](f32x16 v) { return verf(v); });
    case 3:
      return map(x, y, n, [](f32x16 v) { return vsigmoid(v); });
    case 4:
      return map(x, y, n, [](f32x16 v) { return vsqrt(v); });
    default:
      return;
  }
}

}  // namespace kiln::cpu_kernels::KILN_ISA
