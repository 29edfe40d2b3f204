#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/isa_dispatch.h"
#include "kiln/core/dtype.h"

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

// ---- the vec.h functions the elementwise kernels use, and the vectorized casts (both variants)
namespace kiln::cpu_kernels {
KILN_ISA_DECLARE(void, vec_math_f32, (int which, const float* x, float* y, int64_t n));
KILN_ISA_DECLARE(bool, cast_contiguous, (const void* src, DType from, void* dst, DType to, int64_t n));

namespace {

// Distance in float32 ulps between y and the double reference r (r rounded to float first).
double ulps(float y, double r) {
  const float rf = static_cast<float>(r);
  if (y == rf) return 0;
  const double ulp = std::abs(static_cast<double>(std::nextafter(rf, INFINITY)) - rf);
  return std::abs(static_cast<double>(y) - r) / (ulp > 0 ? ulp : std::numeric_limits<float>::denorm_min());
}

struct MathCase {
  int which;
  const char* name;
  double (*reference)(double);
  float lo, hi;
  double max_ulps;
};

double sigmoid_ref(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

void check_math(void (*fn)(int, const float*, float*, int64_t), const char* variant) {
  const MathCase cases[] = {
      {0, "log", [](double x) { return std::log(x); }, 1e-6f, 1e6f, 2.0},
      {1, "tanh", [](double x) { return std::tanh(x); }, -12.0f, 12.0f, 3.0},
      {2, "erf", [](double x) { return std::erf(x); }, -5.0f, 5.0f, 3.0},
      {3, "sigmoid", sigmoid_ref, -90.0f, 30.0f, 4.0},
      {4, "sqrt", [](double x) { return std::sqrt(x); }, 0.0f, 1e4f, 0.5},
  };
  for (const MathCase& c : cases) {
    std::vector<float> x;
    // A geometric sweep for log (many binades), linear elsewhere; plus values near 0 for the odd functions.
    for (int i = 0; i < 200003; ++i) {
      const double t = i / 200002.0;
      x.push_back(c.which == 0 ? static_cast<float>(c.lo * std::pow(c.hi / c.lo, t))
                               : static_cast<float>(c.lo + (c.hi - c.lo) * t));
    }
    for (float v : {1e-7f, -1e-7f, 1e-30f, 0.5f, 0.624f, 0.626f, 0.999f, 1.0f, 1.001f, 3.99f, 4.01f})
      if (v >= c.lo && v <= c.hi) x.push_back(v);
    std::vector<float> y(x.size());
    fn(c.which, x.data(), y.data(), static_cast<int64_t>(x.size()));
    double worst = 0;
    float worst_x = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double ref = c.reference(x[i]);
      if (std::abs(ref) < 1.2e-38) {  // subnormal results (sigmoid far left): absolute error only
        EXPECT_LE(std::abs(y[i] - ref), 1.2e-38) << variant << " " << c.name << "(" << x[i] << ")";
        continue;
      }
      const double e = ulps(y[i], ref);
      if (e > worst) worst = e, worst_x = x[i];
    }
    EXPECT_LE(worst, c.max_ulps) << variant << " " << c.name << " worst at x = " << worst_x;
  }
  // Special values.
  const std::vector<float> specials = {0.0f, -0.0f, -1.0f, INFINITY, -INFINITY, NAN, 1e-40f};
  std::vector<float> y(specials.size());
  fn(0, specials.data(), y.data(), static_cast<int64_t>(specials.size()));
  EXPECT_EQ(y[0], -INFINITY);
  EXPECT_EQ(y[1], -INFINITY);
  EXPECT_TRUE(std::isnan(y[2]));
  EXPECT_EQ(y[3], INFINITY);
  EXPECT_TRUE(std::isnan(y[4]));
  EXPECT_TRUE(std::isnan(y[5]));
  EXPECT_LE(ulps(y[6], std::log(1e-40)), 2.0) << variant << " log of a subnormal";
  for (int which : {1, 2}) {  // tanh and erf saturate to +-1 and keep NaN
    fn(which, specials.data(), y.data(), static_cast<int64_t>(specials.size()));
    EXPECT_EQ(y[3], 1.0f) << variant << " " << which;
    EXPECT_EQ(y[4], -1.0f) << variant << " " << which;
    EXPECT_TRUE(std::isnan(y[5])) << variant << " " << which;
    EXPECT_TRUE(std::signbit(y[1])) << variant << " " << which;
  }
  fn(3, specials.data(), y.data(), static_cast<int64_t>(specials.size()));
  EXPECT_EQ(y[3], 1.0f);
  EXPECT_EQ(y[4], 0.0f);
}

TEST(VecMath, LogTanhErfSigmoidSqrtAreAccurateInBothVariants) {
  check_math(generic::vec_math_f32, "generic");
  if (cpu_features().avx512) check_math(avx512::vec_math_f32, "avx512");
}

// Every bit pattern of the 16-bit types, and float32 values around each 16-bit rounding boundary.
void check_casts(bool (*fn)(const void*, DType, void*, DType, int64_t), const char* variant) {
  std::vector<uint16_t> all(65536 + 7);  // odd length: exercises the partial tail
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(all.size());
  ASSERT_TRUE(fn(all.data(), bfloat16, wide.data(), float32, static_cast<int64_t>(all.size())));
  for (size_t i = 0; i < all.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(wide[i]), std::bit_cast<uint32_t>(bf16_to_f32(bf16_t{all[i]})))
        << variant;
  ASSERT_TRUE(fn(all.data(), float16, wide.data(), float32, static_cast<int64_t>(all.size())));
  for (size_t i = 0; i < all.size(); ++i) {
    const float ref = f16_to_f32(f16_t{all[i]});
    if (std::isnan(ref))
      ASSERT_TRUE(std::isnan(wide[i])) << variant;
    else
      ASSERT_EQ(std::bit_cast<uint32_t>(wide[i]), std::bit_cast<uint32_t>(ref)) << variant << " f16 " << i;
  }
  // float32 -> 16 bits: each 16-bit value, its midpoints to the neighbours and one ulp either side of them.
  std::vector<float> src;
  for (uint32_t h = 0; h < 65536; h += 3) {
    const uint32_t u = h << 16;
    for (int32_t d : {0, 0x7fff, 0x8000, 0x8001, -1, 1})
      src.push_back(std::bit_cast<float>(u + static_cast<uint32_t>(d)));
    const float f = f16_to_f32(f16_t{static_cast<uint16_t>(h)});
    src.push_back(f);
    src.push_back(std::nextafter(f, INFINITY));
    src.push_back(f * 1.00048828125f);  // near the f16 midpoint
  }
  std::vector<uint16_t> narrow(src.size());
  ASSERT_TRUE(fn(src.data(), float32, narrow.data(), bfloat16, static_cast<int64_t>(src.size())));
  for (size_t i = 0; i < src.size(); ++i)
    ASSERT_EQ(narrow[i], f32_to_bf16(src[i]).bits) << variant << " " << src[i];
  ASSERT_TRUE(fn(src.data(), float32, narrow.data(), float16, static_cast<int64_t>(src.size())));
  for (size_t i = 0; i < src.size(); ++i) {
    const uint16_t ref = f32_to_f16(src[i]).bits;
    if ((ref & 0x7fff) > 0x7c00)
      ASSERT_GT(narrow[i] & 0x7fff, 0x7c00) << variant;  // NaN payloads may differ
    else
      ASSERT_EQ(narrow[i], ref) << variant << " " << src[i];
  }
  // bfloat16 -> float16 goes through float32 exactly.
  ASSERT_TRUE(fn(all.data(), bfloat16, narrow.data(), float16, 1000));
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(narrow[i], f32_to_f16(bf16_to_f32(bf16_t{all[i]})).bits);
  EXPECT_FALSE(fn(all.data(), int32, wide.data(), float32, 4));
}

TEST(VecMath, VectorizedCastsMatchScalarConversionsInBothVariants) {
  check_casts(generic::cast_contiguous, "generic");
  if (cpu_features().avx512) check_casts(avx512::cast_contiguous, "avx512");
}

}  // namespace
}  // namespace kiln::cpu_kernels
