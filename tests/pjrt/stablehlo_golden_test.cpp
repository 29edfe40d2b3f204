// Golden StableHLO text for representative calls, each storage held as the device holds it (in the dims of
// the tensor that wrote it: array_dims_as_written): op_module's text must equal tests/data/pjrt/<name>.mlir
// byte for byte (the text is the compile-cache key, and StableHLO's textual form is pinned to the plugin
// version CI tests). After an intended change, regenerate with
//   KILN_UPDATE_GOLDENS=1 ./build/tests/kiln_test_pjrt --gtest_filter='StableHloGolden*'
// and review the diff. Each golden is also compiled by the CPU plugin when one is installed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kiln/ops/attention.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "pjrt/stablehlo_test_support.h"
#include "support/test_data.h"

namespace kiln::pjrt::hlo {
namespace {

using kiln::testing::values;

template <class F>
runtime::OpCall last_call(F&& f) {
  auto calls = testing::capture_calls(f);
  EXPECT_FALSE(calls.empty());
  return calls.back();
}

void expect_golden(const std::string& name, const runtime::OpCall& call,
                   const ArrayDims& array_dims = array_dims_as_written) {
  const std::string text = op_module(call, {}, array_dims).text;
  const std::string path = kiln::testing::data_path("pjrt/" + name + ".mlir");
  const char* update = std::getenv("KILN_UPDATE_GOLDENS");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(path, std::ios::binary) << text;
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << path << " is missing; create it with KILN_UPDATE_GOLDENS=1";
  std::stringstream golden;
  golden << in.rdbuf();
  EXPECT_EQ(text, golden.str()) << "op_module(" << call.describe() << ") differs from " << path
                                << " (KILN_UPDATE_GOLDENS=1 regenerates it)";
  std::string why;
  if (auto client = testing::shared_client(&why)) {
    EXPECT_NO_THROW(client->compile(text)) << path;
  }
}

TEST(StableHloGolden, AddWithBroadcasting) {
  const Tensor a = values({2, 8}, 1), b = values({8}, 2);
  expect_golden("add_broadcast", last_call([&] { add(a, b); }));
}

TEST(StableHloGolden, Bf16LinearWithBias) {
  const Tensor x = values({2, 8}, 3, -1, 1, bfloat16), w = values({4, 8}, 4, -1, 1, bfloat16);
  const Tensor bias = values({4}, 5, -1, 1, bfloat16);
  expect_golden("linear_bf16_bias", last_call([&] { linear(x, w, bias); }));
}

TEST(StableHloGolden, Softmax) {
  const Tensor x = values({2, 8}, 6);
  expect_golden("softmax", last_call([&] { softmax(x, -1); }));
}

TEST(StableHloGolden, CausalAttention) {
  const Tensor q = values({1, 2, 3, 4}, 7), k = values({1, 2, 3, 4}, 8), v = values({1, 2, 3, 4}, 9);
  AttentionOptions options;
  options.is_causal = true;
  expect_golden("attention_causal", last_call([&] { scaled_dot_product_attention(q, k, v, options); }));
}

TEST(StableHloGolden, StridedViewCopyIntoANarrow) {
  const Tensor big = values({3, 8}, 10), src = values({3, 3}, 11);
  // big's storage as big wrote it: [3, 8] (the narrow alone cannot tell).
  const ArrayDims as_big_wrote_it = [&](const Tensor& t) {
    return t.storage() == big.storage() ? big.shape() : array_dims_as_written(t);
  };
  expect_golden("copy_transposed_into_narrow",
                last_call([&] { big.narrow(1, 2, 3).copy_(src.transpose(0, 1)); }), as_big_wrote_it);
}

}  // namespace
}  // namespace kiln::pjrt::hlo
