// nn::Linear's adapters against the formula they implement, y = W x + b + sum_i w_i s_i B_i (A_i x): one and
// two adapters, weights, fusing into the weight and back, and adapters that do not fit.
#include <gtest/gtest.h>

#include <cstring>

#include "kiln/nn/layers.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/quant/quantized_tensor.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::values;

struct Layer {
  nn::Linear linear{24, 40};
  Layer(DType dtype = float32) {
    linear.weight = values({40, 24}, 1, -0.3, 0.3, dtype);
    linear.bias = values({40}, 2, -0.1, 0.1, dtype);
  }
};

// The adapters' product by the formula, in float32.
Tensor by_hand(const Tensor& x, const Tensor& down, const Tensor& up, double factor) {
  return mul(matmul(matmul(x, down.transpose(0, 1)), up.transpose(0, 1)), factor);
}

TEST(LinearLora, OneAndTwoAdaptersAddTheirWeightedProducts) {
  Layer l;
  const Tensor x = values({5, 24}, 3);
  const Tensor a1 = values({4, 24}, 4), b1 = values({40, 4}, 5), a2 = values({2, 24}, 6),
               b2 = values({40, 2}, 7);
  const Tensor plain = l.linear(x);
  l.linear.add_adapter("one", a1, b1, 0.5);
  l.linear.add_adapter("two", a2, b2, 2.0);
  // Added adapters are inactive until named.
  EXPECT_TRUE(testing::all_close(l.linear(x), plain, 0, 0));
  EXPECT_FALSE(l.linear.lora_down().defined());

  l.linear.set_active_adapters({{"one", 1.0}});
  EXPECT_TRUE(testing::all_close(l.linear(x), add(plain, by_hand(x, a1, b1, 0.5)), 1e-5, 1e-6));
  l.linear.set_active_adapters({{"one", 0.8}, {"two", -0.3}, {"absent", 9.0}});
  EXPECT_EQ(l.linear.lora_down().shape(), (Shape{6, 24}));
  EXPECT_EQ(l.linear.lora_up().shape(), (Shape{40, 6}));
  const Tensor expected = add(add(plain, by_hand(x, a1, b1, 0.8 * 0.5)), by_hand(x, a2, b2, -0.3 * 2.0));
  EXPECT_TRUE(testing::all_close(l.linear(x), expected, 1e-5, 1e-6));

  // Fused: the same function, from the weight alone; the weights keep the lora_scale after unfusing.
  const Tensor original = l.linear.weight;
  l.linear.fuse_adapters(0.5);
  EXPECT_TRUE(l.linear.is_fused());
  EXPECT_FALSE(l.linear.lora_down().defined());
  const Tensor half = add(add(plain, by_hand(x, a1, b1, 0.4 * 0.5)), by_hand(x, a2, b2, -0.15 * 2.0));
  EXPECT_TRUE(testing::all_close(l.linear(x), half, 1e-5, 1e-6));
  l.linear.unfuse_adapters();
  EXPECT_EQ(l.linear.weight.storage(), original.storage());
  EXPECT_TRUE(testing::all_close(l.linear(x), half, 1e-5, 1e-6));

  l.linear.delete_adapter("one");
  EXPECT_EQ(l.linear.adapter_names(), std::vector<std::string>{"two"});
  EXPECT_TRUE(testing::all_close(l.linear(x), add(plain, by_hand(x, a2, b2, -0.15 * 2.0)), 1e-5, 1e-6));
  l.linear.clear_adapters();
  EXPECT_TRUE(testing::all_close(l.linear(x), plain, 0, 0));
}

// A weight kept in fp8 (an fp8 checkpoint's Linear weight) takes adapters as the dense layer of its exact
// values does, unfused and fused (fusing widens it into an owned copy); unfusing gives the fp8 bytes back.
TEST(LinearLora, AnFp8WeightTakesAdaptersAsItsExactValuesWould) {
  std::vector<uint8_t> bytes(40 * 24);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>((i * 37 + 11) & 0xbf);  // no NaN
  const quant::QuantizedTensor q{Tensor::from_vector(bytes, {40, 24}), quant::StorageType::F8_E4M3, {40, 24}};
  Layer fp8, dense;
  fp8.linear.weight = q.blocks;
  fp8.linear.weight_storage = {quant::StorageType::F8_E4M3, float32};
  dense.linear.weight = q.dequantize();
  ASSERT_TRUE(fp8.linear.is_quantized());
  const Tensor x = values({5, 24}, 3);
  const Tensor a = values({4, 24}, 4), b = values({40, 4}, 5);
  EXPECT_TRUE(testing::all_close(fp8.linear(x), dense.linear(x), 1e-5, 1e-6));
  for (Layer* l : {&fp8, &dense}) {
    l->linear.add_adapter("one", a, b, 0.5);
    l->linear.set_active_adapters({{"one", 0.8}});
  }
  EXPECT_TRUE(testing::all_close(fp8.linear(x), dense.linear(x), 1e-5, 1e-6));
  fp8.linear.fuse_adapters(1.0);
  EXPECT_FALSE(fp8.linear.is_quantized());
  EXPECT_EQ(fp8.linear.weight.dtype(), float32);
  EXPECT_TRUE(testing::all_close(fp8.linear(x), dense.linear(x), 1e-5, 1e-6));
  fp8.linear.unfuse_adapters();
  EXPECT_TRUE(fp8.linear.is_quantized());
  EXPECT_EQ(fp8.linear.weight.to_vector<uint8_t>(), bytes);
}

TEST(LinearLora, Bfloat16LayerComputesTheProductInBfloat16) {
  Layer l(bfloat16);
  const Tensor x = values({5, 24}, 3, -1, 1, bfloat16);
  const Tensor a = values({4, 24}, 4), b = values({40, 4}, 5);  // float32 in the file: rounded once
  l.linear.add_adapter("one", a, b, 0.5);
  l.linear.set_active_adapters({{"one", 1.0}});
  EXPECT_EQ(l.linear.lora_down().dtype(), bfloat16);
  EXPECT_EQ(l.linear.lora_up().dtype(), bfloat16);
  const Tensor expected =
      add(linear(x, l.linear.weight, l.linear.bias).to(float32), by_hand(x.to(float32), a, b, 0.5));
  // Three bfloat16 roundings (A x, B (A x), the sum) of values of order 1.
  EXPECT_TRUE(testing::all_close(l.linear(x).to(float32), expected, 2e-2, 2e-2));
}

TEST(LinearLora, AdaptersThatDoNotFitAreRefused) {
  Layer l;
  auto error_of = [&](const Tensor& down, const Tensor& up) {
    try {
      l.linear.add_adapter("bad", down, up, 1.0);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(values({4, 23}, 1), values({40, 4}, 2)).find("takes down [rank, 24] and up [40, rank]"),
            std::string::npos);
  EXPECT_NE(error_of(values({4, 24}, 1), values({40, 3}, 2)).find("got down [4, 24] and up [40, 3]"),
            std::string::npos);
  EXPECT_NE(error_of(Tensor::zeros({4, 24}, int32), values({40, 4}, 2)).find("floating point"),
            std::string::npos);
  EXPECT_FALSE(l.linear.has_adapter("bad"));
  // Fused layers take no new weights.
  l.linear.add_adapter("ok", values({4, 24}, 1), values({40, 4}, 2), 1.0);
  l.linear.set_active_adapters({{"ok", 1.0}});
  l.linear.fuse_adapters(1.0);
  EXPECT_THROW(l.linear.set_active_adapters({}), Error);
  EXPECT_THROW(l.linear.fuse_adapters(1.0), Error);
}

}  // namespace
}  // namespace kiln
