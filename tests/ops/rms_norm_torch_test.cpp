// rms_norm's RmsNormStyle::Torch (torch.nn.RMSNorm: one rounding, to x's dtype, after the float32 weight
// product), against torch and against the two-op formulation FLUX's QK norm used before it existed.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "kiln/core/error.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "kiln/pipelines/generator.h"
#include "support/test_data.h"

namespace kiln {
namespace {

TEST(RmsNormTorchStyle, MatchesTorchNnRmsNorm) {
  io::SafetensorsFile file(testing::data_path("kernels/rms_norm_torch.safetensors"));
  std::stringstream list(file.metadata().at("cases"));
  int cases = 0;
  for (std::string name; std::getline(list, name, ',');) {
    SCOPED_TRACE(name);
    const double eps = std::stod(file.metadata().at(name).substr(4));  // "eps=<value>"
    const Tensor x = file.tensor(name + ".input");
    const Tensor expected = file.tensor(name + ".expected");
    const Tensor y = rms_norm(x, file.tensor(name + ".weight"), eps, RmsNormStyle::Torch);
    ASSERT_EQ(y.dtype(), x.dtype());
    ASSERT_EQ(y.shape(), x.shape());
    // torch sums the squares in another order; the mean may differ in its last float32 bit, which moves a
    // rare 16-bit result by one unit.
    const double tol = x.dtype() == float32 ? 1e-6 : x.dtype() == bfloat16 ? 1.0 / 128 : 1.0 / 1024;
    EXPECT_TRUE(testing::all_close(y, expected, tol, tol * 1e-3));
    ++cases;
  }
  EXPECT_EQ(cases, 7);
}

TEST(RmsNormTorchStyle, BitIdenticalToFloat32WeightThenCast) {
  // FLUX's [B, S, H, D] projections with a bf16 weight: rounding once in the kernel gives exactly what a
  // float32 weight, a float32 output and a cast to bf16 gave.
  Generator gen(3);
  for (int64_t d : {int64_t{128}, int64_t{40}, int64_t{7}}) {
    const Tensor x = randn({2, 33, 3, d}, float32, gen).to(bfloat16);
    const Tensor w = randn({d}, float32, gen).to(bfloat16);
    const Tensor fused = rms_norm(x, w, 1e-6, RmsNormStyle::Torch);
    const Tensor two_op = rms_norm(x, w.to(float32), 1e-6, RmsNormStyle::Diffusers).to(bfloat16);
    ASSERT_EQ(fused.dtype(), bfloat16);
    EXPECT_TRUE(testing::all_close(fused, two_op, 0.0, 0.0)) << "d = " << d;
  }
}

// Short 16-bit rows are normalised 16 at a time, their squares' lanes summed for all 16 rows at once: each
// row gives exactly what it gives alone (one row takes the row-at-a-time path), for whole groups and the rows
// left over, in both styles, bf16 and float16, with and without a weight, and for row lengths that end in a
// partial vector.
TEST(RmsNorm, RowsInGroupsOfSixteenMatchEachRowAlone) {
  Generator gen(11);
  for (DType dtype : {bfloat16, float16})
    for (int64_t d : {int64_t{64}, int64_t{128}, int64_t{40}, int64_t{512}})
      for (RmsNormStyle style : {RmsNormStyle::Torch, RmsNormStyle::Diffusers})
        for (bool weighted : {true, false}) {
          const Tensor x = mul(randn({37, d}, float32, gen), 3.0).to(dtype);
          const Tensor w = weighted ? randn({d}, float32, gen).to(dtype) : Tensor();
          const Tensor all = rms_norm(x, w, 1e-6, style);
          for (int64_t r = 0; r < 37; ++r) {
            const Tensor alone = rms_norm(x.narrow(0, r, 1), w, 1e-6, style);
            ASSERT_TRUE(testing::all_close(all.narrow(0, r, 1), alone, 0.0, 0.0))
                << dtype_name(dtype) << " d = " << d << " row " << r << (weighted ? "" : " no weight");
          }
        }
}

TEST(RmsNormTorchStyle, OutputDtypeIsTheInputDtype) {
  const Tensor w16 = Tensor::full({8}, 2.0, bfloat16);
  EXPECT_EQ(rms_norm(Tensor::full({2, 8}, 1.5, float32), w16, 1e-6, RmsNormStyle::Torch).dtype(), float32);
  EXPECT_EQ(
      rms_norm(Tensor::full({2, 8}, 1.5, float16), Tensor::full({8}, 2.0, float32), 1e-6, RmsNormStyle::Torch)
          .dtype(),
      float16);
  const Tensor y = rms_norm(Tensor::full({2, 8}, 1.5, bfloat16), w16, 1e-6, RmsNormStyle::Torch);
  EXPECT_EQ(y.dtype(), bfloat16);
  for (float v : y.to_vector<float>()) EXPECT_EQ(v, 2.0f);  // x / rms(x) of a constant row is 1
  EXPECT_EQ(rms_norm(Tensor::full({2, 8}, 1.5, bfloat16), Tensor(), 1e-6, RmsNormStyle::Torch).dtype(),
            bfloat16);
}

TEST(RmsNormTorchStyle, WrongWeightShapeNamesTheOp) {
  try {
    rms_norm(Tensor::full({2, 8}, 1.0, bfloat16), Tensor::full({7}, 1.0, bfloat16), 1e-6,
             RmsNormStyle::Torch);
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rms_norm"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
