// linear, matmul and conv2d against PyTorch (tools/kernel_refs/linalg.py ->
// tests/data/kernels/linalg.safetensors).
//
// Tolerances. Kiln and torch both accumulate in float32 but in different orders, then round once:
//  * float32: differences are float32 rounding of sums of <= 600 terms: rtol 1e-5 with atol 1e-5 * max|e|
//    (outputs near zero come from cancellation, so their error scales with the operands, not the output).
//  * bfloat16: one bf16 ulp is 2^-8..2^-7 of the value; summation order can move a result across a
//    rounding boundary, and torch rounds its bf16 bias-add separately: rtol 2^-7 (one ulp) and atol
//    2^-7 * max|e| for cancelled outputs. Against the float64 product of the same bf16 inputs (`.exact`)
//    Kiln must be within one ulp: evidence that it accumulates and adds the bias in float32.
//  * float16 (computed in float32, rounded once): one f16 ulp is <= 2^-10 relative: rtol 2^-10,
//    atol 2^-10 * max|e|.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/matmul_path.h"
#include "kiln/core/device_runtime.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const io::SafetensorsFile& refs() {
  static const io::SafetensorsFile file(testing::data_path("kernels/linalg.safetensors"));
  return file;
}

Tensor load(const std::string& name) {
  return refs().tensor(name);
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

::testing::AssertionResult close_to_torch(const Tensor& actual, const Tensor& expected) {
  if (actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(actual.dtype()) << " != expected " << dtype_name(expected.dtype());
  const double scale = max_abs(expected);
  switch (expected.dtype()) {
    case DType::Float32:
      return testing::all_close(actual, expected, 1e-5, 1e-5 * scale);
    case DType::BFloat16:
      return testing::all_close(actual, expected, 0x1p-7, 0x1p-7 * scale);
    case DType::Float16:
      return testing::all_close(actual, expected, 0x1p-10, 0x1p-10 * scale);
    default:
      return ::testing::AssertionFailure() << "unexpected dtype " << dtype_name(expected.dtype());
  }
}

// Message of the kiln::Error `f` throws ("" when it throws nothing).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Sets a prepacking policy for one scope.
class PrepackingScope {
 public:
  explicit PrepackingScope(WeightPrepacking policy) : saved_(weight_prepacking()) {
    set_weight_prepacking(policy);
  }
  ~PrepackingScope() { set_weight_prepacking(saved_); }

 private:
  WeightPrepacking saved_;
};

// Runs the body with prepacking on and off, restoring the setting afterwards.
template <class F>
void with_both_packings(F&& body) {
  const WeightPrepacking saved = weight_prepacking();
  for (WeightPrepacking policy :
       {WeightPrepacking::Always, WeightPrepacking::Never, WeightPrepacking::Auto}) {
    SCOPED_TRACE(policy == WeightPrepacking::Always  ? "prepacked weight"
                 : policy == WeightPrepacking::Never ? "weight in place"
                                                     : "auto");
    set_weight_prepacking(policy);
    body();
  }
  set_weight_prepacking(saved);
}

// ---------------------------------------------------------------- linear

class LinearRef : public ::testing::TestWithParam<std::string> {};

TEST_P(LinearRef, MatchesTorch) {
  const std::string c = GetParam();
  const Tensor x = load(c + ".x"), w = load(c + ".weight"), expected = load(c + ".expected");
  const Tensor bias = refs().contains(c + ".bias") ? load(c + ".bias") : Tensor();
  with_both_packings([&] {
    const Tensor y = linear(x, w, bias);
    EXPECT_EQ(y.shape(), expected.shape());
    EXPECT_TRUE(close_to_torch(y, expected));
    if (refs().contains(c + ".exact")) {
      // Within one bf16 ulp of the correctly rounded result.
      EXPECT_TRUE(testing::all_close(y, load(c + ".exact"), 0x1p-7, 1e-5 * max_abs(expected)));
    }
    // The second call reuses the cached primitive and packed weight: same bits.
    const Tensor again = linear(x, w, bias);
    EXPECT_TRUE(testing::all_close(again, y, 0, 0));
  });
}

INSTANTIATE_TEST_SUITE_P(Cases, LinearRef,
                         ::testing::Values("linear_f32_m7", "linear_f32_m1_nobias", "linear_f32_3d",
                                           "linear_f32_1d", "linear_f32_m11_k200", "linear_f32_k600",
                                           "linear_bf16_m7", "linear_bf16_m1_nobias", "linear_bf16_3d",
                                           "linear_bf16_1d", "linear_bf16_m11_k200", "linear_bf16_k600",
                                           "linear_bf16_f32bias", "linear_f16_m7", "linear_f16_m1_nobias",
                                           "linear_f16_3d", "linear_f16_1d", "linear_f16_m11_k200"));

class LinearLayouts : public ::testing::TestWithParam<std::string> {};

TEST_P(LinearLayouts, NonContiguousOperands) {
  const std::string t = GetParam();
  with_both_packings([&] {
    {
      const Tensor x = load("linear_" + t + "_xT.xt").transpose(0, 1);  // column-major x
      EXPECT_TRUE(close_to_torch(linear(x, load("linear_" + t + "_xT.weight")),
                                 load("linear_" + t + "_xT.expected")));
    }
    {
      const Tensor x = load("linear_" + t + "_xslice.xw").slice(1, 10, 50);  // row stride 60
      EXPECT_TRUE(close_to_torch(linear(x, load("linear_" + t + "_xslice.weight")),
                                 load("linear_" + t + "_xslice.expected")));
    }
    {
      const Tensor w = load("linear_" + t + "_wT.wt").transpose(0, 1);  // column-major weight
      EXPECT_TRUE(close_to_torch(linear(load("linear_" + t + "_wT.x"), w, load("linear_" + t + "_wT.bias")),
                                 load("linear_" + t + "_wT.expected")));
    }
    {
      const Tensor x = load("linear_" + t + "_xperm.x4").permute({1, 0, 2, 3});  // not viewable as [M, K]
      EXPECT_TRUE(close_to_torch(linear(x, load("linear_" + t + "_xperm.weight")),
                                 load("linear_" + t + "_xperm.expected")));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinearLayouts, ::testing::Values("f32", "bf16"));

TEST(Linear, PacksEachWeightOnceAndFreesItWithTheWeight) {
  // Packing is the oneDNN path's: on a host whose bf16 products run on f32 FMA (matmul_path.h) it is unused.
  const cpu_kernels::ScopedBf16Path onednn_path(cpu_kernels::Bf16Path::Onednn);
  const PrepackingScope packing(WeightPrepacking::Always);
  const Tensor x = load("linear_bf16_m11_k200.x");
  const Tensor bias = load("linear_bf16_m11_k200.bias");
  const Tensor expected = load("linear_bf16_m11_k200.expected");
  synchronize();  // ops queued by earlier tests free their tensors when they have run
  const int64_t baseline = memory_stats().current_bytes;
  {
    const Tensor w = load("linear_bf16_m11_k200.weight").clone();  // its own Storage, owned by this test
    const int64_t weight_bytes = memory_stats().current_bytes - baseline;
    linear(x, w);
    synchronize();  // the kernel packs the weight when it runs
    const int64_t after_first = memory_stats().current_bytes;
    EXPECT_GE(after_first - baseline, 2 * weight_bytes);  // the packed copy is at least as large
    for (int i = 0; i < 3; ++i) linear(x, w);
    linear(x.slice(0, 0, 5), w);  // another M reuses the same packed form
    synchronize();
    EXPECT_EQ(memory_stats().current_bytes, after_first);
  }
  // Queued ops hold the weight until they have run.
  synchronize();
  EXPECT_EQ(memory_stats().current_bytes, baseline);  // freed together with the weight's Storage
  // Two views of one Storage get separate packed forms, each correct.
  const Tensor w = load("linear_bf16_m11_k200.weight");
  const Tensor both = Tensor::empty({2 * w.size(0), w.size(1)}, bfloat16);
  both.narrow(0, 0, w.size(0)).copy_(w);
  both.narrow(0, w.size(0), w.size(0)).copy_(Tensor::zeros(w.shape(), bfloat16));
  EXPECT_TRUE(close_to_torch(linear(x, both.narrow(0, 0, w.size(0)), bias), expected));
  const Tensor second = linear(x, both.narrow(0, w.size(0), w.size(0)), bias);  // zero weight: bias only
  EXPECT_TRUE(testing::all_close(second, bias.unsqueeze(0).expand(second.shape()).contiguous(), 0, 0));
}

TEST(Linear, ConcurrentCallsShareOneWeight) {
  const PrepackingScope packing(WeightPrepacking::Always);
  const Tensor x = load("linear_f32_m11_k200.x"), bias = load("linear_f32_m11_k200.bias");
  const Tensor w = load("linear_f32_m11_k200.weight").clone();  // packed for the first time below
  const Tensor expected = load("linear_f32_m11_k200.expected");
  std::vector<Tensor> results(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i) {
    // Different M per thread: different primitives, one packed weight.
    threads.emplace_back(
        [&, i] { results[i] = linear(x.slice(0, 0, 4 + static_cast<int64_t>(i)), w, bias); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i)
    EXPECT_TRUE(close_to_torch(results[i], expected.slice(0, 0, 4 + static_cast<int64_t>(i)).contiguous()))
        << i;
}

TEST(Linear, AutoPolicyPacksBf16AndKeepsF32InPlace) {
  // Packing is the oneDNN path's: on a host whose bf16 products run on f32 FMA (matmul_path.h) it is unused.
  const cpu_kernels::ScopedBf16Path onednn_path(cpu_kernels::Bf16Path::Onednn);
  const PrepackingScope packing(WeightPrepacking::Auto);
  for (DType dtype : {bfloat16, float32, float16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = load("linear_f32_m11_k200.x").to(dtype);
    const Tensor w = load("linear_f32_m11_k200.weight").to(dtype);
    const int64_t before = memory_stats().current_bytes;
    const Tensor y = linear(x, w);
    synchronize();  // the kernel packs the weight when it runs
    const int64_t extra = memory_stats().current_bytes - before - static_cast<int64_t>(y.nbytes());
    if (dtype == float32) {
      EXPECT_EQ(extra, 0);
    } else {  // bf16 packed; f16 converted to a packed f32 copy
      EXPECT_GE(extra, static_cast<int64_t>(w.numel() * (dtype == bfloat16 ? 2 : 4)));
    }
  }
}

TEST(Linear, EmptyDims) {
  const Tensor w = Tensor::full({3, 4}, 1.0);
  EXPECT_EQ(linear(Tensor::empty({0, 4}), w).shape(), (Shape{0, 3}));
  // K = 0: the bias alone, as torch gives.
  const Tensor y =
      linear(Tensor::empty({2, 0}), Tensor::empty({3, 0}), Tensor::from_vector<float>({1, 2, 3}, {3}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
}

TEST(Linear, Errors) {
  const Tensor x = Tensor::zeros({2, 4}), w = Tensor::zeros({3, 4});
  std::string e = error_of([&] { linear(Tensor::zeros({2, 5}), w); });
  EXPECT_NE(e.find("linear"), std::string::npos) << e;
  EXPECT_NE(e.find("[2, 5]"), std::string::npos) << e;
  EXPECT_NE(e.find("[3, 4]"), std::string::npos) << e;
  e = error_of([&] { linear(x, Tensor::zeros({3, 4, 1})); });
  EXPECT_NE(e.find("linear: expected weight [out_features, in_features], got [3, 4, 1]"), std::string::npos)
      << e;
  e = error_of([&] { linear(x.to(bfloat16), w); });
  EXPECT_NE(e.find("linear"), std::string::npos) << e;
  EXPECT_NE(e.find("bfloat16"), std::string::npos) << e;
  EXPECT_NE(e.find("float32"), std::string::npos) << e;
  e = error_of([&] { linear(x, w, Tensor::zeros({4})); });
  EXPECT_NE(e.find("linear: expected bias [3], got [4]"), std::string::npos) << e;
  e = error_of([&] { linear(x.to(bfloat16), w.to(bfloat16), Tensor::zeros({3}, float16)); });
  EXPECT_NE(e.find("linear: bias is float16"), std::string::npos) << e;
  e = error_of([&] { linear(Tensor::zeros({2, 4}, int64), Tensor::zeros({3, 4}, int64)); });
  EXPECT_NE(e.find("linear: x must be float32, bfloat16 or float16, got int64"), std::string::npos) << e;
}

// ---------------------------------------------------------------- matmul

class MatmulRef : public ::testing::TestWithParam<std::string> {};

TEST_P(MatmulRef, MatchesTorch) {
  const std::string c = GetParam();
  const Tensor y = matmul(load(c + ".a"), load(c + ".b"));
  const Tensor expected = load(c + ".expected");
  EXPECT_EQ(y.shape(), expected.shape());
  EXPECT_TRUE(close_to_torch(y, expected));
}

INSTANTIATE_TEST_SUITE_P(Cases, MatmulRef,
                         ::testing::Values("matmul_f32_2d", "matmul_f32_bcast", "matmul_f32_vec_mat",
                                           "matmul_f32_mat_vec", "matmul_f32_dot", "matmul_f32_m1",
                                           "matmul_bf16_2d", "matmul_bf16_bcast", "matmul_bf16_vec_mat",
                                           "matmul_bf16_mat_vec", "matmul_bf16_dot", "matmul_f16_2d",
                                           "matmul_f16_bcast", "matmul_f16_vec_mat", "matmul_f16_mat_vec",
                                           "matmul_f16_dot"));

class MatmulViews : public ::testing::TestWithParam<std::string> {};

TEST_P(MatmulViews, AttentionShapedViews) {
  const std::string c = "attn_" + GetParam();
  // [B, S, H, D] -> [B, H, S, D] views, k^T as a transposed view: all used in place.
  const Tensor q = load(c + ".q").permute({0, 2, 1, 3});
  const Tensor k = load(c + ".k").permute({0, 2, 1, 3});
  const Tensor v = load(c + ".v").permute({0, 2, 1, 3});
  const Tensor scores = matmul(q, k.transpose(-1, -2));
  EXPECT_TRUE(close_to_torch(scores, load(c + ".scores")));
  EXPECT_TRUE(close_to_torch(matmul(load(c + ".scores"), v), load(c + ".pv")));
}

TEST_P(MatmulViews, ExpandedOperand) {
  const std::string c = "matmul_" + GetParam() + "_expanded";
  const Tensor b = load(c + ".b").expand({4, 33, 20});  // stride 0 over the batch
  EXPECT_TRUE(close_to_torch(matmul(load(c + ".a"), b), load(c + ".expected")));
  // Both operands broadcast over a dim that only the expansion creates.
  const Tensor a = load(c + ".a").select(0, 1).unsqueeze(0).expand({4, 7, 33});
  const Tensor y = matmul(a, b);
  ASSERT_EQ(y.shape(), (Shape{4, 7, 20}));
  const Tensor row = load(c + ".expected").select(0, 1);
  for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(close_to_torch(y.select(0, i), row));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MatmulViews, ::testing::Values("f32", "bf16"));

TEST(Matmul, Errors) {
  std::string e = error_of([] { matmul(Tensor::zeros({2, 3}), Tensor::zeros({4, 5})); });
  EXPECT_NE(e.find("matmul"), std::string::npos) << e;
  EXPECT_NE(e.find("[2, 3]"), std::string::npos) << e;
  EXPECT_NE(e.find("[4, 5]"), std::string::npos) << e;
  e = error_of([] { matmul(Tensor::zeros({2, 2, 3}), Tensor::zeros({3, 3, 5})); });
  EXPECT_NE(e.find("matmul"), std::string::npos) << e;
  e = error_of([] { matmul(Tensor::zeros({2, 3}, bfloat16), Tensor::zeros({3, 5})); });
  EXPECT_NE(e.find("matmul: a [2, 3] is bfloat16 but b [3, 5] is float32"), std::string::npos) << e;
  e = error_of([] { matmul(Tensor::zeros({}), Tensor::zeros({3})); });
  EXPECT_NE(e.find("matmul: expected operands with at least 1 dim"), std::string::npos) << e;
}

TEST(Matmul, EmptyK) {
  const Tensor y = matmul(Tensor::empty({2, 0}), Tensor::empty({0, 3}));
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(6, 0.0f));
}

// ---------------------------------------------------------------- conv2d

struct ConvCase {
  std::string name;
  std::array<int64_t, 2> stride, padding, dilation;
  int64_t groups;
};

class Conv2dRef : public ::testing::TestWithParam<ConvCase> {};

TEST_P(Conv2dRef, MatchesTorch) {
  const ConvCase& c = GetParam();
  const Tensor bias = refs().contains(c.name + ".bias") ? load(c.name + ".bias") : Tensor();
  const Tensor y =
      conv2d(load(c.name + ".x"), load(c.name + ".weight"), bias, c.stride, c.padding, c.dilation, c.groups);
  const Tensor expected = load(c.name + ".expected");
  EXPECT_EQ(y.shape(), expected.shape());
  EXPECT_TRUE(close_to_torch(y, expected));
}

std::vector<ConvCase> conv_cases() {
  std::vector<ConvCase> cases;
  for (std::string t : {"f32", "bf16", "f16"}) {
    cases.push_back({"conv_" + t + "_3x3", {1, 1}, {1, 1}, {1, 1}, 1});
    cases.push_back({"conv_" + t + "_1x1_nobias", {1, 1}, {0, 0}, {1, 1}, 1});
    cases.push_back({"conv_" + t + "_stride2", {2, 2}, {1, 1}, {1, 1}, 1});
    cases.push_back({"conv_" + t + "_groups", {1, 1}, {1, 1}, {1, 1}, 2});
  }
  cases.push_back({"conv_f32_dilation", {1, 1}, {2, 2}, {2, 2}, 1});
  cases.push_back({"conv_f32_asym", {2, 3}, {1, 0}, {1, 1}, 1});
  cases.push_back({"conv_f32_depthwise", {1, 1}, {1, 1}, {1, 1}, 8});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, Conv2dRef, ::testing::ValuesIn(conv_cases()),
                         [](const ::testing::TestParamInfo<ConvCase>& info) { return info.param.name; });

TEST(Conv2d, NonContiguousAndUnbatchedInput) {
  const Tensor x = load("conv_f32_nhwc.x_nhwc").permute({0, 3, 1, 2});
  const Tensor w = load("conv_f32_nhwc.weight"), b = load("conv_f32_nhwc.bias");
  const Tensor expected = load("conv_f32_nhwc.expected");
  EXPECT_TRUE(close_to_torch(conv2d(x, w, b, {1, 1}, {1, 1}), expected));
  const Tensor one = conv2d(x.select(0, 1), w, b, {1, 1}, {1, 1});
  EXPECT_EQ(one.shape(), (Shape{6, 8, 8}));
  EXPECT_TRUE(close_to_torch(one, expected.select(0, 1).contiguous()));
}

TEST(Conv2d, Errors) {
  const Tensor x = Tensor::zeros({1, 4, 5, 5});
  std::string e = error_of([&] { conv2d(x, Tensor::zeros({2, 3, 3, 3})); });
  EXPECT_NE(e.find("conv2d"), std::string::npos) << e;
  EXPECT_NE(e.find("[1, 4, 5, 5]"), std::string::npos) << e;
  EXPECT_NE(e.find("[2, 3, 3, 3]"), std::string::npos) << e;
  e = error_of([&] { conv2d(x, Tensor::zeros({2, 4, 3})); });
  EXPECT_NE(e.find("conv2d: expected weight"), std::string::npos) << e;
  e = error_of([&] { conv2d(x, Tensor::zeros({3, 2, 3, 3}), {}, {1, 1}, {0, 0}, {1, 1}, 2); });
  EXPECT_NE(e.find("out_channels divisible by groups"), std::string::npos) << e;
  e = error_of([&] { conv2d(x, Tensor::zeros({2, 4, 7, 7})); });
  EXPECT_NE(e.find("conv2d: kernel [2, 4, 7, 7]"), std::string::npos) << e;
  e = error_of([&] { conv2d(x, Tensor::zeros({2, 4, 3, 3}), {}, {0, 1}); });
  EXPECT_NE(e.find("conv2d: expected stride >= 1"), std::string::npos) << e;
  e = error_of([&] { conv2d(x.to(bfloat16), Tensor::zeros({2, 4, 3, 3})); });
  EXPECT_NE(e.find("conv2d: x [1, 4, 5, 5] is bfloat16 but weight [2, 4, 3, 3] is float32"),
            std::string::npos)
      << e;
  e = error_of([&] { conv2d(x, Tensor::zeros({2, 4, 3, 3}), Tensor::zeros({3})); });
  EXPECT_NE(e.find("conv2d: expected bias [2], got [3]"), std::string::npos) << e;
}

}  // namespace
}  // namespace kiln
