// hlo::region_module: a chain of calls as one StableHLO module. Golden text for one region (the text is the
// compile-cache key; KILN_UPDATE_GOLDENS=1 regenerates tests/data/pjrt/region_*.mlir, review the diff), and
// what becomes a parameter and a result: storages read before being written, and only the values marked
// stored — intermediates are values inside the module, never results.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "backends/pjrt/stablehlo/region_module.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "pjrt/stablehlo_test_support.h"
#include "support/test_data.h"

namespace kiln::pjrt::hlo {
namespace {

using kiln::testing::values;

// The calls `f` dispatches as one region, storing only the outputs of the calls in `stored_calls`
// (negative: counted from the end).
template <class F>
runtime::DeviceRegion region_of(F&& f, std::vector<int> stored_calls) {
  runtime::DeviceRegion r;
  r.calls = testing::capture_calls(f);
  const int n = static_cast<int>(r.calls.size());
  for (int& i : stored_calls) i = i < 0 ? n + i : i;
  for (int i = 0; i < n; ++i) {
    const bool keep = std::find(stored_calls.begin(), stored_calls.end(), i) != stored_calls.end();
    r.stored.emplace_back(r.calls[static_cast<size_t>(i)].outputs.size(), keep);
  }
  return r;
}

size_t storage_params(const RegionModule& m) {
  size_t n = 0;
  for (const RegionModule::Param& p : m.params) n += p.scalar ? 0 : 1;
  return n;
}

TEST(RegionModule, ScalarsAreParametersSoTheTextDoesNotDependOnThem) {
  const Tensor x = values({2, 8}, 1);
  const RegionModule a = region_module(region_of([&] { exp(mul(x, 0.5)); }, {-1}));
  const RegionModule b = region_module(region_of([&] { exp(mul(x, -3.25)); }, {-1}));
  EXPECT_EQ(a.text, b.text);
  ASSERT_EQ(b.params.size(), 2u);
  EXPECT_TRUE(b.params[1].scalar);
  EXPECT_EQ(b.params[1].value, -3.25);
}

// x -> mul -> add -> gelu -> linear -> softmax -> add -> layer_norm: elementwise, a product, a reduction and
// a norm, as a block chains them.
runtime::DeviceRegion chain_region(std::vector<int> stored) {
  const Tensor x = values({2, 8}, 1), w = values({4, 8}, 2), b = values({4}, 3), g = values({4}, 4),
               beta = values({4}, 5);
  return region_of(
      [&] {
        const Tensor h = gelu(add(mul(x, 0.75), 0.25), GeluApproximate::Tanh);
        const Tensor y = linear(h, w, b);
        layer_norm(add(softmax(y, -1), y), 1, g, beta, 1e-5);
      },
      std::move(stored));
}

TEST(RegionModule, AChainIsOneModuleWithItsGoldenText) {
  const runtime::DeviceRegion region = chain_region({-1});
  ASSERT_GE(region.calls.size(), 7u);
  // The storages held as a device holds them: in the dims they were written in.
  const RegionModule m = region_module(region, {}, array_dims_as_written);
  // x, w, b, gamma, beta: each read before anything in the region writes it; and the two scalars (0.75 and
  // 0.25), passed at each launch so that other values reuse the executable.
  ASSERT_EQ(m.params.size(), 7u);
  EXPECT_EQ(storage_params(m), 5u);
  EXPECT_TRUE(m.params[1].scalar && m.params[1].value == 0.75 && m.params[1].dtype == float32);
  EXPECT_TRUE(m.params[2].scalar && m.params[2].value == 0.25);
  ASSERT_EQ(m.results.size(), 1u) << "only the norm's output is stored";
  EXPECT_EQ(m.results[0].call, static_cast<int64_t>(region.calls.size()) - 1);

  const std::string path = kiln::testing::data_path("pjrt/region_chain.mlir");
  const char* update = std::getenv("KILN_UPDATE_GOLDENS");
  if (update != nullptr && std::string(update) == "1") std::ofstream(path, std::ios::binary) << m.text;
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << path << " is missing; create it with KILN_UPDATE_GOLDENS=1";
  std::stringstream golden;
  golden << in.rdbuf();
  EXPECT_EQ(m.text, golden.str()) << region.describe() << " differs from " << path
                                  << " (KILN_UPDATE_GOLDENS=1 regenerates it)";
  std::string why;
  if (auto client = testing::shared_client(&why)) {
    EXPECT_NO_THROW(client->compile(m.text)) << path;
  }
}

TEST(RegionModule, StoredIntermediatesBecomeResultsInOrderOfFirstWrite) {
  const runtime::DeviceRegion region = chain_region({0, -1});
  const RegionModule m = region_module(region);
  ASSERT_EQ(m.results.size(), 2u);
  EXPECT_EQ(m.results[0].call, 0);
  EXPECT_TRUE(m.results[0].output);
  EXPECT_EQ(storage_params(m), 5u);
}

TEST(RegionModule, AStorageWrittenInPartFirstIsAParameterKeepingTheRest) {
  const Tensor big = values({3, 8}, 10), src = values({3, 3}, 11);
  const runtime::DeviceRegion region = region_of(
      [&] {
        big.narrow(1, 2, 3).copy_(exp(src));
        tanh(big);
      },
      {-1});
  const RegionModule m = region_module(region);
  // src, then big's old elements (the narrow keeps them); the tanh reads the updated storage.
  ASSERT_EQ(m.params.size(), 2u);
  EXPECT_FALSE(m.params[0].source.output);
  EXPECT_TRUE(m.params[1].source.output);
  EXPECT_EQ(m.params[1].dims, Shape({24}));
  EXPECT_EQ(m.results.size(), 1u);
}

TEST(RegionModule, StoragesArePassedAndReturnedInTheirArraysDims) {
  const Tensor x = values({2, 8}, 1), w = values({4, 8}, 2), big = values({3, 8}, 10);
  const runtime::DeviceRegion region = region_of(
      [&] {
        exp(linear(x, w));
        big.narrow(1, 2, 4).copy_(values({3, 4}, 11));
      },
      {0, 1, -1});
  // big's storage as big wrote it: [3, 8] (the narrow alone cannot tell).
  const ArrayDims as_big_wrote_it = [&](const Tensor& t) {
    return t.storage() == big.storage() ? big.shape() : array_dims_as_written(t);
  };
  const RegionModule m = region_module(region, {}, as_big_wrote_it);
  std::vector<Shape> dims;
  for (const RegionModule::Param& p : m.params)
    if (!p.scalar) dims.push_back(p.dims);
  // x and w as they are (a product reads its weight with no reshape: a relayout on a TPU), the copy's source,
  // and big's old elements in big's dims.
  ASSERT_EQ(dims.size(), 4u) << m.text;
  EXPECT_EQ(dims[0], Shape({2, 8}));
  EXPECT_EQ(dims[1], Shape({4, 8}));
  EXPECT_EQ(dims[3], Shape({3, 8}));
  EXPECT_EQ(m.text.find("stablehlo.reshape"), std::string::npos) << m.text;
  EXPECT_NE(m.text.find("-> (tensor<2x4xf32>, tensor<2x4xf32>, tensor<3x8xf32>)"), std::string::npos)
      << m.text;
  std::string why;
  if (auto client = testing::shared_client(&why)) {
    EXPECT_NO_THROW(client->compile(m.text));
  }
}

TEST(RegionModule, AStorageReadAsAnotherDtypeIsRefusedNamingTheCall) {
  const Tensor x = values({4}, 12);
  runtime::DeviceRegion region = region_of([&] { exp(x); }, {0});
  // The same storage read back as int32, as a bitcast view would.
  const Tensor& made = region.calls[0].outputs[0];
  runtime::OpCall reread = region.calls[0];
  reread.inputs = {Tensor(made.storage(), made.shape(), made.strides(), made.offset(), int32)};
  region.calls.push_back(reread);
  region.stored.push_back({true});
  try {
    region_module(region);
    FAIL() << "a dtype change inside the region was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("as float32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln::pjrt::hlo
