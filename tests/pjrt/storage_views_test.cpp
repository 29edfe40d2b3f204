// Views of storages held as shaped arrays (storage_views.h): what load_view / store_view emit when the array
// has the dims the view is read in (no reshape at all: a TPU would relayout), and, on the PJRT plugin, that
// every view reads and writes the same elements whatever dims the array is held in (flat, the view's own,
// another shape of the same elements).
#include <gtest/gtest.h>

#include <numeric>

#include "backends/pjrt/stablehlo/storage_views.h"
#include "pjrt/stablehlo_test_support.h"

namespace kiln::pjrt::hlo {
namespace {

int count(const std::string& text, const std::string& op) {
  int n = 0;
  for (size_t at = text.find("\"stablehlo." + op + "\""); at != std::string::npos;
       at = text.find("\"stablehlo." + op + "\"", at + 1))
    ++n;
  return n;
}

// The module reading `layout` from an f32 array of `dims`.
std::string load_text(const Shape& dims, const ViewLayout& layout) {
  HloBuilder b;
  const Value array = b.parameter(float32, dims);
  return b.module_text({load_view(b, array, layout)});
}

// The module writing a value of the view's shape into `layout` of an f32 array of `dims`.
std::string store_text(const Shape& dims, const ViewLayout& layout) {
  HloBuilder b;
  const Value array = b.parameter(float32, dims);
  const Value value = b.parameter(float32, layout.shape);
  return b.module_text({store_view(b, array, value, layout)});
}

TEST(ShapedStorageViews, AnArrayReadInItsOwnShapeIsTheParameterItself) {
  const std::string text = load_text({4, 6}, {{4, 6}, {6, 1}, 0});
  EXPECT_TRUE(text.find("func.return\"(%arg0)") != std::string::npos) << text;
  EXPECT_EQ(count(text, "reshape"), 0) << text;
}

TEST(ShapedStorageViews, ATransposeOrANarrowOfTheArraysDimsNeedsNoReshape) {
  // w.t(): a transpose only.
  std::string text = load_text({4, 6}, {{6, 4}, {1, 6}, 0});
  EXPECT_EQ(count(text, "transpose"), 1) << text;
  EXPECT_EQ(count(text, "reshape"), 0) << text;
  // Rows 1..2 of a [4, 6] array (a fused projection's slice): one slice of the 2-D array.
  text = load_text({4, 6}, {{2, 6}, {6, 1}, 6});
  EXPECT_EQ(count(text, "slice"), 1) << text;
  EXPECT_EQ(count(text, "reshape"), 0) << text;
  EXPECT_TRUE(text.find("start_indices = array<i64: 1, 0>") != std::string::npos) << text;
  // Columns 2..4, every other row, then broadcast over a new leading dim.
  text = load_text({4, 6}, {{3, 2, 3}, {0, 12, 1}, 2});
  EXPECT_EQ(count(text, "slice"), 1) << text;
  EXPECT_EQ(count(text, "broadcast_in_dim"), 1) << text;
  EXPECT_EQ(count(text, "pad"), 0) << text;
  // One row of a [2, 3, 4] array, heads first: a slice, then a transpose.
  text = load_text({2, 3, 4}, {{4, 3}, {1, 4}, 12});
  EXPECT_EQ(count(text, "slice"), 1) << text;
  EXPECT_EQ(count(text, "transpose"), 1) << text;
}

TEST(ShapedStorageViews, HeadsSplitOffADimAreOneReshape) {
  // [2, 12] read as [2, 3, 4] (a projection's output split into heads): one reshape.
  std::string text = load_text({2, 12}, {{2, 3, 4}, {12, 4, 1}, 0});
  EXPECT_EQ(count(text, "reshape"), 1) << text;
  EXPECT_EQ(count(text, "slice"), 0) << text;
  // The keys of a fused [S, 3 * H * D] projection, heads first ([H, S, D], H = 2, D = 4): split, sliced,
  // transposed; never flat.
  text = load_text({5, 24}, {{2, 5, 4}, {4, 24, 1}, 8});
  EXPECT_EQ(count(text, "reshape"), 1) << text;
  EXPECT_TRUE(text.find("tensor<5x6x4xf32>") != std::string::npos) << text;
  EXPECT_EQ(count(text, "slice"), 1) << text;
  EXPECT_EQ(count(text, "transpose"), 1) << text;
  EXPECT_TRUE(text.find("tensor<120xf32>") == std::string::npos) << text;
}

TEST(ShapedStorageViews, AViewAcrossTheArraysRowsReadsItFlat) {
  // A [4, 6] array read as [3, 4] rows of 4: no split of the array's dims gives it.
  const std::string text = load_text({4, 6}, {{3, 4}, {4, 1}, 0});
  EXPECT_TRUE(text.find("-> tensor<24xf32>") != std::string::npos) << text;
}

TEST(ShapedStorageViews, AWriteIntoANarrowIsOneUpdateOfTheShapedArray) {
  // concat's second piece: columns 2..4 of a [3, 8] array.
  const std::string text = store_text({3, 8}, {{3, 3}, {8, 1}, 2});
  EXPECT_EQ(count(text, "dynamic_update_slice"), 1) << text;
  EXPECT_EQ(count(text, "reshape"), 0) << text;
  EXPECT_EQ(count(text, "pad"), 0) << text;
  EXPECT_TRUE(text.find("-> (tensor<3x8xf32>)") != std::string::npos) << text;
  // A write the array's dims cannot express keeps the array's dims.
  const std::string strided = store_text({3, 8}, {{3, 2}, {8, 3}, 1});
  EXPECT_TRUE(strided.find("-> (tensor<3x8xf32>)") != std::string::npos) << strided;
}

TEST(ShapedStorageViews, AWholeWriteIsAMatrixOfItsInnermostDim) {
  EXPECT_EQ(whole_storage_dims({{2, 8}, {8, 1}, 0}), Shape({2, 8}));
  EXPECT_EQ(whole_storage_dims({{2, 3, 16}, {48, 16, 1}, 0}), Shape({6, 16}));
  EXPECT_EQ(whole_storage_dims({{}, {}, 0}), Shape({1}));
  EXPECT_EQ(whole_storage_dims({{7}, {1}, 0}), Shape({7}));
  // Dims of one element are dropped: [1, S, D] and [S, D] are held alike.
  EXPECT_EQ(whole_storage_dims({{1, 5, 8}, {40, 8, 1}, 0}), Shape({5, 8}));
  EXPECT_EQ(whole_storage_dims({{5, 8}, {8, 1}, 0}), Shape({5, 8}));
  EXPECT_EQ(whole_storage_dims({{1, 5, 1}, {5, 1, 7}, 0}), Shape({5}));
  // Attention's [B, H, S, D] output written sequence-major: the storage holds [B * S * H, D].
  EXPECT_EQ(whole_storage_dims({{2, 3, 5, 4}, {60, 4, 12, 1}, 0}), Shape({30, 4}));
  // A transposed write: its strides' order.
  EXPECT_EQ(whole_storage_dims({{16, 2}, {1, 16}, 0}), Shape({2, 16}));
  // Innermost dims a TPU pads stay flat: a 3x3 convolution's weight, [S, 3] position ids.
  EXPECT_EQ(whole_storage_dims({{8, 4, 3, 3}, {36, 9, 3, 1}, 0}), Shape({288}));
  EXPECT_EQ(device_array_dims({5, 3}), Shape({15}));
  EXPECT_EQ(device_array_dims({5, 12}), Shape({60}));
  EXPECT_EQ(device_array_dims({5, 2}), Shape({5, 2}));
  EXPECT_EQ(device_array_dims({5, 24}), Shape({5, 24}));
  HloBuilder b;
  const Value v = b.parameter(float32, {16, 2});
  EXPECT_EQ(store_whole(b, v, {{16, 2}, {1, 16}, 0}).shape, Shape({2, 16}));
  const Value x = b.parameter(float32, {1, 4, 8});
  EXPECT_EQ(store_whole(b, x, {{1, 4, 8}, {32, 8, 1}, 0}).shape, Shape({4, 8}));
}

// ---- on the plugin: every view, every array shape, the same elements

std::shared_ptr<Client> client_or_skip(std::string* why) {
  return testing::shared_client(why);
}

std::vector<float> iota_values(int64_t n, float from) {
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::vector<float> run(Client& client, const std::string& text, const std::vector<std::vector<float>>& args,
                       const std::vector<Shape>& dims) {
  const auto exe = client.compile(text);
  std::vector<std::shared_ptr<Buffer>> buffers;
  for (size_t i = 0; i < args.size(); ++i)
    buffers.push_back(
        client.buffer_from_host(args[i].data(), args[i].size() * sizeof(float), float32, dims[i], 0));
  const auto out = client.execute_on(*exe, buffers, 0);
  std::vector<float> result(out.at(0)->bytes() / sizeof(float));
  out[0]->to_host(result.data(), result.size() * sizeof(float));
  return result;
}

// The element offset of view index `i` (row-major over the view's shape).
int64_t element_at(const ViewLayout& v, int64_t i) {
  int64_t at = v.offset;
  for (size_t d = v.shape.size(); d-- > 0;) {
    at += (i % v.shape[d]) * v.strides[d];
    i /= v.shape[d];
  }
  return at;
}

struct Case {
  ViewLayout view;
  int64_t storage;            // elements
  std::vector<Shape> arrays;  // the dims the storage may be held in
  bool writable = true;       // no broadcast dim, no element twice
};

std::vector<Case> cases() {
  return {
      {{{4, 6}, {6, 1}, 0}, 24, {{24}, {4, 6}, {2, 12}, {2, 2, 6}}},         // the whole storage
      {{{6, 4}, {1, 6}, 0}, 24, {{24}, {4, 6}, {2, 12}}},                    // a transpose
      {{{2, 6}, {6, 1}, 6}, 24, {{24}, {4, 6}, {2, 2, 6}}},                  // rows 1..2
      {{{4, 3}, {6, 1}, 2}, 24, {{24}, {4, 6}, {2, 12}}},                    // a narrow of the inner dim
      {{{2, 3}, {12, 2}, 1}, 24, {{24}, {4, 6}, {2, 12}}},                   // steps in both dims
      {{{3, 2, 3}, {0, 12, 1}, 2}, 24, {{24}, {4, 6}}, false},               // broadcast, step, narrow
      {{{2, 3, 4}, {12, 4, 1}, 0}, 24, {{24}, {2, 12}, {4, 6}, {2, 3, 4}}},  // split into heads
      {{{2, 4, 3}, {12, 1, 4}, 0}, 24, {{24}, {2, 3, 4}, {2, 12}}},          // heads, permuted
      {{{5, 4}, {3, 1}, 1}, 24, {{24}, {4, 6}}, false},                      // overlapping windows
      {{{1, 1}, {7, 3}, 17}, 24, {{24}, {4, 6}, {2, 3, 4}}},                 // one element
      {{{4}, {6}, 3}, 24, {{24}, {4, 6}}},                                   // a column
  };
}

TEST(ShapedStorageViews, EveryViewReadsTheSameElementsWhateverTheArraysDims) {
  std::string why;
  const auto client = client_or_skip(&why);
  if (!client) GTEST_SKIP() << why;
  for (const Case& c : cases()) {
    for (const Shape& dims : c.arrays) {
      HloBuilder b;
      const std::string text = b.module_text({load_view(b, b.parameter(float32, dims), c.view)});
      const std::vector<float> got = run(*client, text, {iota_values(c.storage, 0)}, {dims});
      ASSERT_EQ(got.size(), static_cast<size_t>(shape_numel(c.view.shape)));
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], static_cast<float>(element_at(c.view, static_cast<int64_t>(i))))
            << "view " << shape_str(c.view.shape) << " strides " << shape_str(c.view.strides) << " offset "
            << c.view.offset << " of an array " << shape_str(dims) << ", element " << i << "\n"
            << text;
    }
  }
}

TEST(ShapedStorageViews, EveryWriteKeepsTheRestWhateverTheArraysDims) {
  std::string why;
  const auto client = client_or_skip(&why);
  if (!client) GTEST_SKIP() << why;
  for (const Case& c : cases()) {
    if (!c.writable) continue;
    for (const Shape& dims : c.arrays) {
      HloBuilder b;
      const Value array = b.parameter(float32, dims);
      const Value value = b.parameter(float32, c.view.shape);
      const Value stored = store_view(b, array, value, c.view);
      ASSERT_EQ(stored.shape, dims) << "a write changed the array's dims";
      const int64_t n = shape_numel(c.view.shape);
      const std::vector<float> got =
          run(*client, b.module_text({stored}), {iota_values(c.storage, 0), iota_values(n, 1000)},
              {dims, c.view.shape});
      std::vector<float> want = iota_values(c.storage, 0);
      for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(element_at(c.view, i))] = 1000.0f + float(i);
      EXPECT_EQ(got, want) << "view " << shape_str(c.view.shape) << " strides " << shape_str(c.view.strides)
                           << " offset " << c.view.offset << " of an array " << shape_str(dims);
    }
  }
}

}  // namespace
}  // namespace kiln::pjrt::hlo
