#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "backends/cpu/cpu_features.h"
#include "kiln/ops/reduction.h"
#include "ops/reference_cases.h"

namespace kiln {
namespace {

using testing::load_reference_cases;
using testing::matches_reference;
using testing::operand;

TEST(Reduction, MatchesTorchOnReferenceCases) {
  io::SafetensorsFile file(testing::data_path("kernels/reduction.safetensors"));
  const auto cases = load_reference_cases(file);
  ASSERT_GT(cases.size(), 100u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const Tensor x = operand(file, c, "input");
    const auto dims = c.ints("dims");
    const bool keepdim = c.integer("keepdim") != 0;
    const std::string& op = c.arg("op");
    Tensor y;
    if (op == "sum")
      y = sum(x, dims, keepdim);
    else if (op == "mean")
      y = mean(x, dims, keepdim);
    else if (op == "max")
      y = max(x, dims, keepdim);
    else if (op == "var")
      y = var(x, dims, c.has("correction") ? c.integer("correction") : 1, keepdim);
    else
      FAIL() << "unknown op " << op;
    EXPECT_TRUE(matches_reference(y, file.tensor(c.name + ".expected"), c));
  }
}

// Deterministic values in [-1, 1) with a few exact zeros, without depending on a random engine's stream.
Tensor pattern(const Shape& shape, float offset = 0.0f) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  uint32_t s = 12345;
  for (auto& e : v) {
    s = s * 1664525u + 1013904223u;
    e = static_cast<float>(s >> 8) / 8388608.0f - 1.0f + offset;
  }
  return Tensor::from_vector(v, shape);
}

// Row reductions of a [rows, n] float tensor in double precision.
std::vector<double> reference_rows(const Tensor& x, const std::string& op) {
  const auto v = x.to_vector<double>();
  const int64_t rows = x.size(0), n = x.size(1);
  std::vector<double> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0, m = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      s += v[r * n + i];
      m = std::max(m, v[r * n + i]);
    }
    double m2 = 0;
    for (int64_t i = 0; i < n; ++i) m2 += (v[r * n + i] - s / n) * (v[r * n + i] - s / n);
    out[r] = op == "sum" ? s : op == "mean" ? s / n : op == "max" ? m : m2 / (n - 1);
  }
  return out;
}

void expect_rows(const Tensor& actual, const std::vector<double>& expected, double tol) {
  const auto a = actual.to_vector<double>();
  ASSERT_EQ(a.size(), expected.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], expected[i], tol * std::max(1.0, std::abs(expected[i]))) << "at " << i;
}

TEST(Reduction, ParallelRowAndColumnPathsAgreeWithDouble) {
  const Tensor x = pattern({96, 1003}, 0.25f);  // above the parallel threshold, odd row length
  for (const std::string op : {"sum", "mean", "max", "var"}) {
    SCOPED_TRACE(op);
    auto run = [&](const Tensor& t, std::vector<int64_t> dims) {
      if (op == "sum") return sum(t, dims);
      if (op == "mean") return mean(t, dims);
      if (op == "max") return max(t, dims);
      return var(t, dims);
    };
    const auto expected = reference_rows(x, op);
    expect_rows(run(x, {1}), expected, 2e-6);
    // The same reduction as columns of the transposed copy, and through a non-contiguous view.
    const Tensor xt = x.transpose(0, 1).contiguous();
    expect_rows(run(xt, {0}), expected, 2e-6);
    expect_rows(run(x.transpose(0, 1), {0}), expected, 2e-6);
  }
}

TEST(Reduction, LongFloat32SumsStayAccurate) {
  // 3,000,017 copies of 0.1f: a single float32 accumulator would be off by several percent.
  const int64_t n = 3'000'017;
  const Tensor x = Tensor::full({n}, 0.1, float32);
  const double exact = static_cast<double>(n) * static_cast<double>(0.1f);
  EXPECT_NEAR(sum(x).item(), exact, exact * 1e-6);
  EXPECT_NEAR(mean(x).item(), static_cast<double>(0.1f), 1e-7);
  EXPECT_NEAR(var(x).item(), 0.0, 1e-12);
  // Two long rows, reduced in parallel across the row.
  const Tensor rows = pattern({2, 1'500'007}, 1.0f);
  expect_rows(sum(rows, {1}), reference_rows(rows, "sum"), 1e-6);
  expect_rows(var(rows, {-1}), reference_rows(rows, "var"), 1e-6);
  // The column path with a long reduced extent.
  const Tensor cols = pattern({200'003, 20}, 1.0f);
  expect_rows(sum(cols, {0}), reference_rows(cols.transpose(0, 1).contiguous(), "sum"), 1e-6);
}

TEST(Reduction, VarianceIsStableForLargeMeans) {
  std::vector<float> v;
  for (int i = 0; i < 4001; ++i) v.push_back(10000.0f + ((i % 2) ? 0.5f : -0.5f));
  const Tensor x = Tensor::from_vector(v, {4001});
  // population variance of +-0.5 around the mean (one extra -0.5): ~0.25
  const double mean_v = 10000.0 - 0.5 / 4001.0;
  double m2 = 0;
  for (float f : v) m2 += (f - mean_v) * (f - mean_v);
  EXPECT_NEAR(var(x, {}, 0).item(), m2 / 4001, 1e-6);
}

TEST(Reduction, ShapesDtypesAndEdgeCases) {
  const Tensor x = pattern({2, 3, 4});
  EXPECT_EQ(sum(x, {1}, true).shape(), (Shape{2, 1, 4}));
  EXPECT_EQ(sum(x, {-1, 0}).shape(), (Shape{3}));
  EXPECT_EQ(sum(x).shape(), Shape{});
  EXPECT_EQ(max(x, {}, true).shape(), (Shape{1, 1, 1}));
  // Integers and bools sum to int64.
  const Tensor ints = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor s = sum(ints, {1});
  EXPECT_EQ(s.dtype(), int64);
  EXPECT_EQ(s.to_vector<int64_t>(), (std::vector<int64_t>{6, 15}));
  EXPECT_EQ(sum(Tensor::from_vector<int32_t>({1, 0, 1}, {3}).to(boolean)).item(), 2.0);
  EXPECT_EQ(max(ints, {0}).to_vector<int32_t>(), (std::vector<int32_t>{4, 5, 6}));
  // float64 takes the scalar path.
  const Tensor d = Tensor::from_vector<double>({1.0, 2.0, 4.0}, {3});
  EXPECT_DOUBLE_EQ(var(d).item(), 7.0 / 3.0);
  // A 0-d tensor reduces over dim 0 / -1 like torch; empty extents give torch's values.
  const Tensor scalar = Tensor::full({}, 2.5);
  EXPECT_EQ(sum(scalar, {0}).item(), 2.5);
  EXPECT_EQ(mean(scalar, {-1}).item(), 2.5);
  const Tensor empty = Tensor::zeros({3, 0});
  EXPECT_EQ(sum(empty, {1}).to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_TRUE(std::isnan(mean(empty, {1}).to_vector<float>()[0]));
  // Variance with N - correction <= 0 is nan (0/0), as in torch.
  EXPECT_TRUE(std::isnan(var(Tensor::full({1}, 3.0)).item()));
}

void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected kiln::Error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Reduction, BadArgumentsNameTheOp) {
  const Tensor x = pattern({2, 3});
  expect_error([&] { sum(x, {2}); }, "sum");
  expect_error([&] { sum(x, {1, -1}); }, "sum: dimension -1 appears more than once");
  expect_error(
      [&] {
        mean(Tensor::from_vector<int32_t>({1, 2}, {2}));
      },
      "mean: expected a floating-point tensor");
  expect_error([&] { var(x, {}, -1); }, "var: correction must be >= 0");
  expect_error([&] { max(Tensor::zeros({2, 0}), {1}); }, "max: cannot reduce over an empty extent");
  expect_error([&] { sum(Tensor()); }, "sum: input is an undefined tensor");
}

// Runs this test binary again with KILN_CPU_ISA=generic so that every reference test above (and the norm and
// layout suites) also checks the portable kernel variant.
TEST(ReductionIsa, GenericVariantPassesTheSameTests) {
  if (!cpu_kernels::use_avx512()) GTEST_SKIP() << "this run already uses the generic variant";
  const testing::ChildRun run =
      testing::run_this_binary("KILN_CPU_ISA=generic", "Reduction*:Norm*:Layout*:-ReductionIsa*");
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("[  PASSED  ]"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace kiln
