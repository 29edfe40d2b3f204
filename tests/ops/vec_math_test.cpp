#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backends/cpu/isa_dispatch.h"

namespace kiln::cpu_kernels {
KILN_ISA_DECLARE(void, exp_f32, (const float*, float*, int64_t));

namespace {

void check_exp(void (*fn)(const float*, float*, int64_t)) {
  std::vector<float> x;
  for (float v = -90.0f; v <= 90.0f; v += 0.0137f) x.push_back(v);
  x.push_back(NAN);
  x.push_back(INFINITY);
  x.push_back(-INFINITY);
  std::vector<float> y(x.size());
  fn(x.data(), y.data(), static_cast<int64_t>(x.size()));  // size is not a multiple of 16: tail path too
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = std::exp(static_cast<double>(x[i]));
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i]));
    } else if (ref > 3.4e38) {
      EXPECT_TRUE(std::isinf(y[i])) << x[i];
    } else if (ref < 1.2e-38) {
      EXPECT_LE(y[i], 1.2e-38f) << x[i];
    } else {
      EXPECT_LE(std::abs(y[i] - ref) / ref, 4e-7) << "exp(" << x[i] << ") = " << y[i] << ", expected " << ref;
    }
  }
}

TEST(VecMath, ExpIsAccurateInBothVariants) {
  check_exp(generic::exp_f32);
  if (cpu_features().avx512) check_exp(avx512::exp_f32);
}

}  // namespace
}  // namespace kiln::cpu_kernels
