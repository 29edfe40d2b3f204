// apply_rope on a head-split view ([B, S, H, D] memory seen as [B, H, S, D]) keeps that memory order in its
// output, with the values of the contiguous path, in both ISA variants of the kernel.
#include <gtest/gtest.h>

#include <vector>

#include "backends/cpu/reduction_kernels.h"
#include "kiln/ops/layout.h"
#include "kiln/pipelines/generator.h"
#include "support/test_data.h"

namespace kiln {
namespace {

TEST(RopeLayout, HeadSplitViewGivesSequenceMajorOutputWithTheSameValues) {
  Generator gen(11);
  const int64_t b = 2, s = 9, h = 3, d = 38;  // d: two vectors plus a tail of 6
  const Tensor cos = randn({s, d}, float32, gen), sin = randn({s, d}, float32, gen);
  for (DType dt : {float32, bfloat16, float16}) {
    for (RopeStyle style : {RopeStyle::Interleaved, RopeStyle::RotateHalf}) {
      const Tensor bshd = randn({b, s, h, d}, float32, gen).to(dt);
      const Tensor view = bshd.transpose(1, 2);  // [B, H, S, D], not contiguous
      const Tensor y = apply_rope(view, cos, sin, style);
      EXPECT_EQ(y.shape(), (Shape{b, h, s, d}));
      EXPECT_TRUE(y.transpose(1, 2).is_contiguous()) << "the [B, S, H, D] order is kept";
      const Tensor y_contiguous = apply_rope(view.contiguous(), cos, sin, style);
      EXPECT_TRUE(y_contiguous.is_contiguous());
      EXPECT_TRUE(testing::all_close(y, y_contiguous, 0.0, 0.0)) << dtype_name(dt);
    }
  }
  // One head or one position: nothing to keep, the output is contiguous.
  const Tensor one_head = randn({1, 5, 1, 8}, float32, gen).transpose(1, 2);
  EXPECT_TRUE(
      apply_rope(one_head, randn({5, 8}, float32, gen), randn({5, 8}, float32, gen), RopeStyle::Interleaved)
          .is_contiguous());
}

void check_strided_kernel(decltype(&cpu_kernels::generic::rope) rope) {
  // x with padded rows (stride 20 for D = 16 + 2) written into a [B, S, H, D] output seen as [B, H, S, D].
  const int64_t B = 1, H = 2, S = 3, D = 18, xs = 20;
  std::vector<float> x(static_cast<size_t>(B * H * S * xs)), cos(S * D), sin(S * D);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) - 8.0f;
  for (size_t i = 0; i < cos.size(); ++i) {
    cos[i] = 0.25f * static_cast<float>(i % 5);
    sin[i] = 0.5f - 0.125f * static_cast<float>(i % 7);
  }
  std::vector<float> y(static_cast<size_t>(B * S * H * D), -1.0f);
  cpu_kernels::RopeShape shape{B, H, S, D, {H * S * xs, S * xs, xs}, {S * H * D, D, H * D}};
  rope(RopeStyle::Interleaved, float32, x.data(), shape, cos.data(), sin.data(), y.data());
  for (int64_t hh = 0; hh < H; ++hh) {
    for (int64_t ss = 0; ss < S; ++ss) {
      const float* xr = x.data() + hh * S * xs + ss * xs;
      const float* yr = y.data() + ss * H * D + hh * D;
      for (int64_t i = 0; i < D; i += 2) {
        const float* c = cos.data() + ss * D;
        const float* sn = sin.data() + ss * D;
        EXPECT_EQ(yr[i], xr[i] * c[i] + (-xr[i + 1]) * sn[i]) << hh << " " << ss << " " << i;
        EXPECT_EQ(yr[i + 1], xr[i + 1] * c[i + 1] + xr[i] * sn[i + 1]) << hh << " " << ss << " " << i;
      }
    }
  }
}

TEST(RopeLayout, KernelWritesThroughOutputStridesInBothVariants) {
  check_strided_kernel(cpu_kernels::generic::rope);
  if (cpu_kernels::cpu_features().avx512) check_strided_kernel(cpu_kernels::avx512::rope);
}

}  // namespace
}  // namespace kiln
