// The families added as registered units (Chroma, Z-Image, Qwen-Image) on a PJRT device (pipe.to("xla-cpu"))
// in strict eager and the three other modes, and offloaded onto it (by component, and by groups of blocks
// copied ahead): diffusers' image within one 8-bit level, as on the cpu
// (tests/pipelines/<family>_*_test.cpp), and the cpu backend's image within one level. Each runs a guided
// golden: Chroma's with its attention mask, Z-Image's with a prompt and a negative prompt padded to different
// lengths (two programs a step), Qwen-Image's with true CFG (two calls a step) and two images per prompt.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "kiln/core/allocator.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/runtime/memory_policy.h"
#include "support/pipeline_comparison.h"
#include "support/pjrt_devices.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const Device xla0 = testing::test_device(0);

// The golden's image 0 within one level of diffusers' on 99% of values, and of `cpu` everywhere.
void expect_image(const PipelineOutput& out, const testing::GoldenFile& g, const Image& cpu,
                  const std::string& what) {
  ASSERT_FALSE(out.images.empty()) << what;
  const Tensor reference = g["image_u8"].select(0, 0);
  std::printf("[ levels   ] %s %s: max %d vs diffusers, max %d vs the cpu backend\n",
              g.meta("pipeline").c_str(), what.c_str(),
              testing::max_level_difference(out.images[0], reference),
              testing::max_level_difference(out.images[0], cpu));
  EXPECT_GE(testing::share_within_one_level(out.images[0].pixels, reference), 0.99) << what;
  EXPECT_LE(testing::max_level_difference(out.images[0], cpu), 1) << what;
}

// (golden folder, case)
class FamilyOnDevice : public ::testing::TestWithParam<std::pair<const char*, const char*>> {
 protected:
  testing::GoldenFile golden() const { return {GetParam().first, GetParam().second}; }
};

TEST_P(FamilyOnDevice, EveryModeGivesDiffusersImage) {
  KILN_SKIP_WITHOUT_PJRT();
  const testing::GoldenFile g = golden();
  const Image cpu = g.load()->operator()(g.request()).images.front();
  for (ExecutionMode mode :
       {ExecutionMode::Eager, ExecutionMode::Fuse, ExecutionMode::Compile, ExecutionMode::CompileBlocks}) {
    auto pipe = g.load();
    pipe->to(xla0);
    pipe->configure({.mode = mode});
    const PipelineOutput out = (*pipe)(g.request());
    expect_image(out, g, cpu, std::string("on ") + xla0.str() + " --mode " + execution_mode_name(mode));
    EXPECT_EQ((*pipe)(g.request()).images[0].pixels, out.images[0].pixels)
        << "a second call changed the image";
  }
}

TEST_P(FamilyOnDevice, OffloadedOntoTheDeviceGivesDiffusersImage) {
  KILN_SKIP_WITHOUT_PJRT();
  const testing::GoldenFile g = golden();
  const Image cpu = g.load()->operator()(g.request()).images.front();
  {
    auto pipe = g.load();
    pipe->enable_model_cpu_offload(xla0);
    const int64_t idle = memory_stats(xla0).current_bytes;
    expect_image((*pipe)(g.request()), g, cpu, "model offload onto " + xla0.str());
    EXPECT_EQ(memory_stats(xla0).current_bytes, idle) << "a component stayed on the device";
  }
  auto pipe = g.load();
  pipe->enable_group_offload({.blocks_per_group = 1, .prefetch = true, .onload_device = xla0});
  expect_image((*pipe)(g.request()), g, cpu, "group offload onto " + xla0.str());
  EXPECT_GT(pipe->context().memory().weight_group_stats().prefetches, 0) << "no group was brought in ahead";
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyOnDevice,
                         ::testing::Values(std::pair{"chroma", "cfg_cat_64x64_s0"},
                                           std::pair{"z_image", "cfg_cat_64x64_s1"},
                                           std::pair{"qwen_image", "cfg_48x80_s1"}),
                         [](const auto& info) { return std::string(info.param.first); });

}  // namespace
}  // namespace kiln
