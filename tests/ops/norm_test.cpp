#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "kiln/ops/nn.h"
#include "ops/reference_cases.h"

namespace kiln {
namespace {

using testing::load_reference_cases;
using testing::matches_reference;
using testing::operand;

Tensor optional_operand(const io::SafetensorsFile& file, const testing::ReferenceCase& c,
                        const std::string& key) {
  return file.contains(c.name + "." + key) ? file.tensor(c.name + "." + key) : Tensor();
}

TEST(Norm, MatchesTorchOnReferenceCases) {
  io::SafetensorsFile file(testing::data_path("kernels/norm.safetensors"));
  const auto cases = load_reference_cases(file);
  ASSERT_GT(cases.size(), 40u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const Tensor x = operand(file, c, "input");
    const Tensor w = optional_operand(file, c, "weight");
    const Tensor b = optional_operand(file, c, "bias");
    const std::string& op = c.arg("op");
    Tensor y;
    if (op == "softmax") {
      y = softmax(x, c.integer("dim"));
    } else if (op == "layer_norm") {
      y = layer_norm(x, c.integer("normalized_dims"), w, b, c.real("eps"));
    } else if (op == "rms_norm") {
      const auto style = c.arg("style") == "llama" ? RmsNormStyle::Llama : RmsNormStyle::Diffusers;
      y = rms_norm(x, w, c.real("eps"), style);
    } else if (op == "group_norm") {
      y = group_norm(x, c.integer("groups"), w, b, c.real("eps"));
    } else {
      FAIL() << "unknown op " << op;
    }
    EXPECT_TRUE(matches_reference(y, file.tensor(c.name + ".expected"), c));
  }
}

TEST(Norm, RmsNormOutputDtypesFollowTheModules) {
  const Tensor x = Tensor::full({2, 8}, 1.5, bfloat16);
  const Tensor w32 = Tensor::full({8}, 2.0, float32);
  const Tensor w16 = Tensor::full({8}, 2.0, bfloat16);
  // diffusers: a float32 weight gives float32 output even for bf16 input; a bf16 weight gives bf16.
  EXPECT_EQ(rms_norm(x, w32, 1e-6).dtype(), float32);
  EXPECT_EQ(rms_norm(x.to(float32), w16, 1e-6).dtype(), bfloat16);
  EXPECT_EQ(rms_norm(x, Tensor(), 1e-6).dtype(), bfloat16);
  // Llama/Mistral: the promotion of input and weight.
  EXPECT_EQ(rms_norm(x, w32, 1e-6, RmsNormStyle::Llama).dtype(), float32);
  EXPECT_EQ(rms_norm(x.to(float16), w16, 1e-6, RmsNormStyle::Llama).dtype(), float32);
  // x / rms(x) of a constant row is 1; times the weight 2.
  for (float v : rms_norm(x, w16, 1e-6).to_vector<float>()) EXPECT_EQ(v, 2.0f);
}

TEST(Norm, SoftmaxRowsSumToOneOnWideRows) {
  // FLUX-attention-like width, many rows: the parallel path, vector body plus tail.
  const int64_t rows = 64, n = 3079;
  std::vector<float> v(static_cast<size_t>(rows * n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7919) % 1000) * 0.02f - 10.0f;
  for (DType dt : {float32, bfloat16}) {
    const Tensor y = softmax(Tensor::from_vector(v, {rows, n}).to(dt), -1);
    const Tensor s = y.to(float32);
    const auto p = s.to_vector<float>();
    for (int64_t r = 0; r < rows; ++r) {
      double total = 0;
      for (int64_t i = 0; i < n; ++i) total += p[r * n + i];
      EXPECT_NEAR(total, 1.0, dt == float32 ? 1e-5 : 5e-3) << "row " << r;
    }
  }
  // A 0-d softmax is 1.
  EXPECT_EQ(softmax(Tensor::full({}, 3.0), 0).item(), 1.0);
}

void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected kiln::Error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Norm, BadArgumentsNameTheOp) {
  const Tensor x = Tensor::zeros({2, 6, 4});
  expect_error([&] { softmax(Tensor::zeros({3}, int64), 0); },
               "softmax: expected a float32, bfloat16 or float16");
  expect_error([&] { softmax(x, 3); }, "softmax");
  expect_error([&] { layer_norm(x, 1, Tensor::zeros({5}), Tensor(), 1e-5); },
               "layer_norm: weight must have shape [4], got [5]");
  expect_error(
      [&] {
        layer_norm(x, Shape{6, 5}, Tensor(), Tensor(), 1e-5);
      },
      "layer_norm: normalized_shape [6, 5] must match");
  expect_error([&] { layer_norm(x, 4, Tensor(), Tensor(), 1e-5); },
               "layer_norm: normalized_dims must be in [1, 3]");
  expect_error([&] { rms_norm(x, Tensor::zeros({6}), 1e-6); }, "rms_norm: weight must have shape [4]");
  expect_error([&] { group_norm(x, 4, Tensor(), Tensor(), 1e-5); }, "group_norm: 6 channels");
  expect_error([&] { group_norm(Tensor::zeros({6}), 2, Tensor(), Tensor(), 1e-5); },
               "group_norm: expected input [N, C, *]");
  expect_error([&] { group_norm(x, 3, Tensor::zeros({6}, int32), Tensor(), 1e-5); },
               "group_norm: weight must be float32, bfloat16 or float16");
}

}  // namespace
}  // namespace kiln
