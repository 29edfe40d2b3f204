// HloBuilder's text and checks, and the storage views' choice of fast path, without a plugin.
#include <gtest/gtest.h>

#include <limits>

#include "backends/pjrt/stablehlo/hlo_builder.h"
#include "backends/pjrt/stablehlo/storage_views.h"
#include "kiln/core/error.h"

namespace kiln::pjrt::hlo {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(HloBuilder, WritesGenericOpsAndTheMainSignature) {
  HloBuilder b("t");
  const Value x = b.parameter(float32, {2, 3});
  const Value y = b.parameter(float32, {3});
  const Value sum = b.binary_bcast("add", x, y);
  const std::string text = b.module_text({sum});
  EXPECT_TRUE(contains(text,
                       "module @t {\n  func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<3xf32>) "
                       "-> (tensor<2x3xf32>) {"))
      << text;
  EXPECT_TRUE(contains(text,
                       "\"stablehlo.broadcast_in_dim\"(%arg1) <{broadcast_dimensions = array<i64: 1>}> : "
                       "(tensor<3xf32>) -> tensor<2x3xf32>"))
      << text;
  EXPECT_TRUE(
      contains(text, "\"stablehlo.add\"(%arg0, %2) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>"))
      << text;
  EXPECT_TRUE(contains(text, "\"func.return\"(%3) : (tensor<2x3xf32>) -> ()")) << text;
}

TEST(HloBuilder, NonFiniteAndHalfConstantsAreExact) {
  HloBuilder b;
  b.scalar(-std::numeric_limits<double>::infinity(), float32);
  b.scalar(std::numeric_limits<double>::quiet_NaN(), float32);
  b.scalar(-std::numeric_limits<double>::infinity(), bfloat16);
  b.scalar(1.0 / 3, bfloat16);
  b.splat(1, boolean, {2});
  const std::string text = b.module_text({});
  EXPECT_TRUE(contains(text, "dense<0xFF800000> : tensor<f32>")) << text;
  EXPECT_TRUE(contains(text, "dense<0x7FC00000> : tensor<f32>")) << text;
  EXPECT_TRUE(contains(text, "dense<0xFF80> : tensor<bf16>")) << text;
  // 1/3 rounded to bf16 (0x3EAB) is 0.333984375, written so that it parses back to exactly that.
  EXPECT_TRUE(contains(text, "dense<3.339843750e-01> : tensor<bf16>")) << text;
  EXPECT_TRUE(contains(text, "dense<true> : tensor<2xi1>")) << text;
}

TEST(HloBuilder, ReduceHasABodyRegionWithFreshNames) {
  HloBuilder b;
  const Value x = b.parameter(float32, {4, 5});
  const Value r = b.reduce(x, {1}, ReduceKind::Max);
  EXPECT_EQ(r.shape, Shape({4}));
  const std::string text = b.module_text({r});
  EXPECT_TRUE(contains(text, "dense<0xFF800000>")) << text;  // max starts from -inf
  EXPECT_TRUE(contains(text, "^bb0(%2: tensor<f32>, %3: tensor<f32>):")) << text;
  EXPECT_TRUE(contains(text, "\"stablehlo.maximum\"(%2, %3)")) << text;
  EXPECT_TRUE(contains(text, "<{dimensions = array<i64: 1>}>")) << text;
}

TEST(HloBuilder, ShapeMismatchesAreErrorsNamingTheOp) {
  HloBuilder b;
  const Value x = b.parameter(float32, {2, 3});
  const Value y = b.parameter(float32, {3, 2});
  EXPECT_THROW(b.add(x, y), Error);
  EXPECT_THROW(b.reshape(x, {4}), Error);
  try {
    b.dot_general(x, x, DotDims{{}, {}, {1}, {0}}, float32);
    FAIL() << "contracting 3 with 2 was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "dot_general: contracting dims differ")) << e.what();
  }
  HloBuilder other;
  EXPECT_THROW(other.neg(x), Error);  // a value of another builder
  EXPECT_THROW(b.neg(Value{}), Error);
}

TEST(HloBuilder, DotGeneralShapeAndAttributes) {
  HloBuilder b;
  const Value q = b.parameter(bfloat16, {2, 3, 5, 8});
  const Value k = b.parameter(bfloat16, {2, 3, 7, 8});
  const Value s = b.dot_general(q, k, DotDims{{0, 1}, {0, 1}, {3}, {3}}, float32);
  EXPECT_EQ(s.shape, Shape({2, 3, 5, 7}));
  EXPECT_EQ(s.dtype, float32);
  EXPECT_TRUE(contains(b.module_text({s}),
                       "#stablehlo.dot<lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], "
                       "lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [3]>"));
}

TEST(HloBuilder, AWhileLoopCarriesItsValuesAndRefusesOthers) {
  HloBuilder b;
  const Value x = b.parameter(float32, {4});
  const std::vector<Value> out = b.while_loop(
      {b.scalar(0, DType::Int64), x},
      [&](const std::vector<Value>& c) { return b.compare(Compare::LT, c[0], b.scalar(3, DType::Int64)); },
      [&](const std::vector<Value>& c) {
        return std::vector<Value>{b.add(c[0], b.scalar(1, DType::Int64)), b.add(c[1], c[1])};
      });
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].shape, Shape({4}));
  const std::string text = b.module_text({out[1]});
  EXPECT_TRUE(contains(text, ":2 = \"stablehlo.while\"(")) << text;
  EXPECT_TRUE(contains(text, "\"func.return\"(%" + std::to_string(out[0].id) + "#1)")) << text;
  // x from outside the loop, used inside it: refused (it must come through the carry).
  try {
    b.while_loop(
        {b.scalar(0, DType::Int64)},
        [&](const std::vector<Value>& c) { return b.compare(Compare::LT, c[0], b.scalar(3, DType::Int64)); },
        [&](const std::vector<Value>& c) {
          (void)b.neg(x);
          return std::vector<Value>{c[0]};
        });
    FAIL() << "a value from outside the loop was used inside it";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "pass it through the loop's carry")) << e.what();
  }
  // The builder is usable again after the refusal, outside the loop.
  EXPECT_NO_THROW(b.neg(x));
}

// Counts ops of a kind in the module that loads `layout` from a storage of n elements.
int count_ops(const ViewLayout& layout, int64_t n, const std::string& op) {
  HloBuilder b;
  const Value flat = b.parameter(float32, {n});
  const std::string text = b.module_text({load_view(b, flat, layout)});
  int count = 0;
  for (size_t at = text.find("\"stablehlo." + op + "\""); at != std::string::npos;
       at = text.find("\"stablehlo." + op + "\"", at + 1))
    ++count;
  return count;
}

TEST(StorageViews, PicksTheCheapestPathForEachLayout) {
  // The whole storage: one reshape.
  EXPECT_EQ(count_ops({{2, 3}, {3, 1}, 0}, 6, "reshape"), 1);
  EXPECT_EQ(count_ops({{2, 3}, {3, 1}, 0}, 6, "slice"), 0);
  // A transpose: reshape + transpose, no gather.
  EXPECT_EQ(count_ops({{3, 2}, {1, 3}, 0}, 6, "transpose"), 1);
  EXPECT_EQ(count_ops({{3, 2}, {1, 3}, 0}, 6, "gather"), 0);
  // A narrow of the inner dim: the flat array split into [4, 8] rows and sliced, no gather, no padding.
  EXPECT_EQ(count_ops({{4, 3}, {8, 1}, 2}, 32, "gather"), 0);
  EXPECT_EQ(count_ops({{4, 3}, {8, 1}, 2}, 32, "pad"), 0);
  EXPECT_EQ(count_ops({{4, 3}, {8, 1}, 2}, 32, "slice"), 1);
  // A strided box whose rows the storage's size does not split: slices of the flat array, the box's last row
  // padded where it runs past the storage.
  EXPECT_EQ(count_ops({{4, 3}, {8, 1}, 2}, 30, "gather"), 0);
  EXPECT_EQ(count_ops({{4, 3}, {8, 1}, 2}, 30, "pad"), 1);
  // A broadcast dim: broadcast_in_dim.
  EXPECT_EQ(count_ops({{4, 3}, {0, 1}, 0}, 3, "broadcast_in_dim"), 1);
  // Overlapping windows: the gather fallback.
  EXPECT_EQ(count_ops({{5, 4}, {3, 1}, 1}, 20, "gather"), 1);
}

TEST(StorageViews, AViewPastTheStorageIsAnError) {
  HloBuilder b;
  const Value flat = b.parameter(float32, {10});
  try {
    load_view(b, flat, {{3, 4}, {4, 1}, 0});
    FAIL() << "a 12-element view of 10 elements was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "reaches element 11 of a storage of 10")) << e.what();
  }
}

TEST(StorageViews, WritingABroadcastViewIsRefused) {
  HloBuilder b;
  const Value flat = b.parameter(float32, {3});
  const Value v = b.parameter(float32, {4, 3});
  EXPECT_THROW(store_view(b, flat, v, {{4, 3}, {0, 1}, 0}), Error);
}

}  // namespace
}  // namespace kiln::pjrt::hlo
