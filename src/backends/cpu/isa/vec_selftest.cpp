// Compiles vec.h in both ISA variants so that a broken header fails the build, and exposes vexp for the
// accuracy test in tests/ops/vec_math_test.cpp.
#include "backends/cpu/isa/vec.h"

namespace kiln::cpu_kernels::KILN_ISA {

void exp_f32(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(y + i, vexp(load(x + i)));
  if (i < n)
    store_partial(y + i, vexp(load_partial(x + i, static_cast<int>(n - i))), static_cast<int>(n - i));
}

}  // namespace kiln::cpu_kernels::KILN_ISA
