// nn::Conv2d's adapters (PEFT's lora.Conv2d, LoCon) against the function they implement: the convolution
// whose kernel is W + sum_i w_i s_i reshape(B_i @ A_i) (up [out, rank] times down [rank, in * k * k]), here
// with a stride and padding that down must share. One and two adapters of different ranks, weights, fusing
// into the kernel and back, bfloat16, and pairs that do not fit.
#include <gtest/gtest.h>

#include <string>

#include "kiln/core/error.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::values;

// A downsampler's shape: 3x3, stride 2, padding 1.
struct Layer {
  nn::Conv2d conv{6, 10, 3, 2, 1};
  explicit Layer(DType dtype = float32) {
    conv.weight = values({10, 6, 3, 3}, 1, -0.3, 0.3, dtype);
    conv.bias = values({10}, 2, -0.1, 0.1, dtype);
  }
};

// The kernel plus factor * up @ down, by hand in float32.
Tensor merged(const Tensor& weight, const Tensor& down, const Tensor& up, double factor) {
  const int64_t rank = down.size(0);
  const Tensor delta = matmul(up.reshape({up.size(0), rank}), down.reshape({rank, down.numel() / rank}));
  return add(weight.to(float32), mul(delta.reshape(weight.shape()), factor));
}

Tensor conv_with(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return conv2d(x, weight, bias, {2, 2}, {1, 1});
}

TEST(ConvLora, OneAndTwoAdaptersAddTheirWeightedKernels) {
  Layer l;
  const Tensor x = values({2, 6, 9, 9}, 3);
  const Tensor a1 = values({4, 6, 3, 3}, 4, -0.3, 0.3), b1 = values({10, 4, 1, 1}, 5, -0.3, 0.3);
  const Tensor a2 = values({2, 6, 3, 3}, 6, -0.3, 0.3), b2 = values({10, 2, 1, 1}, 7, -0.3, 0.3);
  const Tensor plain = l.conv(x);
  l.conv.add_adapter("one", a1, b1, 0.5);
  l.conv.add_adapter("two", a2, b2, 2.0);
  // Added adapters are inactive until named.
  EXPECT_TRUE(testing::all_close(l.conv(x), plain, 0, 0));
  EXPECT_FALSE(l.conv.lora_down().defined());

  l.conv.set_active_adapters({{"one", 1.0}});
  EXPECT_TRUE(testing::all_close(l.conv(x), conv_with(x, merged(l.conv.weight, a1, b1, 0.5), l.conv.bias),
                                 1e-5, 1e-5));
  l.conv.set_active_adapters({{"one", 0.8}, {"two", -0.3}, {"absent", 9.0}});
  EXPECT_EQ(l.conv.lora_down().shape(), (Shape{6, 6, 3, 3}));
  EXPECT_EQ(l.conv.lora_up().shape(), (Shape{10, 6, 1, 1}));
  const Tensor both = merged(merged(l.conv.weight, a1, b1, 0.8 * 0.5), a2, b2, -0.3 * 2.0);
  EXPECT_TRUE(testing::all_close(l.conv(x), conv_with(x, both, l.conv.bias), 1e-5, 1e-5));

  // Fused: the same function from the kernel alone; unfused, the original kernel back (the same tensor).
  const Tensor original = l.conv.weight;
  l.conv.fuse_adapters(0.5);
  EXPECT_TRUE(l.conv.is_fused());
  EXPECT_FALSE(l.conv.lora_down().defined());
  const Tensor half = merged(merged(original, a1, b1, 0.4 * 0.5), a2, b2, -0.15 * 2.0);
  EXPECT_TRUE(testing::all_close(l.conv.weight, half, 1e-6, 1e-6));
  EXPECT_TRUE(testing::all_close(l.conv(x), conv_with(x, half, l.conv.bias), 1e-5, 1e-5));
  EXPECT_THROW(l.conv.set_active_adapters({{"one", 1.0}}), Error);
  l.conv.unfuse_adapters();
  EXPECT_EQ(l.conv.weight.storage(), original.storage());
  EXPECT_TRUE(testing::all_close(l.conv(x), conv_with(x, half, l.conv.bias), 1e-5, 1e-5));

  l.conv.delete_adapter("one");
  EXPECT_EQ(l.conv.adapter_names(), std::vector<std::string>{"two"});
  l.conv.clear_adapters();
  EXPECT_TRUE(testing::all_close(l.conv(x), plain, 0, 0));
}

// In bfloat16 the combined pair is in the layer's dtype, and the output stays within bfloat16's rounding of
// the float32 function; the fused kernel is bfloat16 too.
TEST(ConvLora, Bfloat16RunsInTheLayersDtype) {
  Layer l(bfloat16);
  const Tensor x = values({1, 6, 8, 8}, 3, -1, 1, bfloat16);
  const Tensor a = values({4, 6, 3, 3}, 4, -0.3, 0.3), b = values({10, 4, 1, 1}, 5, -0.3, 0.3);
  l.conv.add_adapter("one", a, b, 0.5);
  l.conv.set_active_adapters({{"one", 1.0}});
  EXPECT_EQ(l.conv.lora_down().dtype(), bfloat16);
  EXPECT_EQ(l.conv.lora_up().dtype(), bfloat16);
  const Tensor expected = conv_with(x.to(float32), merged(l.conv.weight, a, b, 0.5), l.conv.bias.to(float32));
  EXPECT_TRUE(testing::all_close(l.conv(x).to(float32), expected, 0.03, 0.03));
  l.conv.fuse_adapters(1.0);
  EXPECT_EQ(l.conv.weight.dtype(), bfloat16);
  EXPECT_TRUE(testing::all_close(l.conv(x).to(float32), expected, 0.03, 0.03));
}

// A pair that does not fit the convolution is refused naming the adapter, the kernel and both shapes.
TEST(ConvLora, PairsThatDoNotFitAreRefusedWithTheirShapes) {
  Layer l;
  const auto error_of = [&](const Tensor& down, const Tensor& up) {
    try {
      l.conv.add_adapter("bad", down, up, 1.0);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  for (const auto& [down, up] : std::vector<std::pair<Tensor, Tensor>>{
           {values({4, 6, 1, 1}, 1), values({10, 4, 1, 1}, 2)},  // a 1x1 kernel for a 3x3 convolution
           {values({4, 6, 3, 3}, 1), values({10, 4, 3, 3}, 2)},  // up not 1x1
           {values({4, 5, 3, 3}, 1), values({10, 4, 1, 1}, 2)},  // other input channels
           {values({4, 54}, 1), values({10, 4}, 2)}}) {          // a Linear's pair
    const std::string error = error_of(down, up);
    EXPECT_NE(
        error.find("Conv2d.add_adapter 'bad': a convolution of weight [10, 6, 3, 3] takes down [rank, 6, 3, "
                   "3] and up [10, rank, 1, 1], got down " +
                   shape_str(down.shape()) + " and up " + shape_str(up.shape())),
        std::string::npos)
        << error;
  }
  EXPECT_TRUE(l.conv.adapter_names().empty());
}

}  // namespace
}  // namespace kiln
