// Z-Image in every execution mode and under every offload on the CPU: diffusers' image
// (tools/goldens/z_image.py) within one 8-bit level, as strict eager gives it (z_image_pipeline_test.cpp). A
// guided call whose prompt and negative prompt pad to different lengths runs two batches a step (one per
// length), each its own compiled program. On a PJRT device: tests/devices/families_on_device_test.cpp; split
// over ranks: tests/dist/tensor_parallel_z_image_test.cpp.
#include <gtest/gtest.h>

#include <optional>

#include "kiln/families/z_image/z_image_pipeline.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/eager_mode.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::GoldenFile;

ZImagePipeline load_z_image(const GoldenFile& g) {
  return ZImagePipeline::from_pretrained(testing::data_path("models/" + g.meta("model")),
                                         {.dtype = g.meta("dtype") == "bfloat16" ? bfloat16 : float32});
}

void expect_golden_image(const PipelineOutput& out, const GoldenFile& g, const std::string& what) {
  ASSERT_EQ(out.images.size(), 1u) << what;
  EXPECT_GE(testing::share_within_one_level(out.images[0].pixels, g["image_u8"].select(0, 0)), 0.99) << what;
}

template <class Pipeline>
PipelineOutput in_mode(Pipeline& pipe, ExecutionMode mode, const PipelineRequest& request) {
  pipe.configure({.mode = mode});
  std::optional<EagerModeGuard> fuse;
  if (mode == ExecutionMode::Fuse) fuse.emplace(EagerMode::DeferAndFuse);
  return pipe(request);
}

TEST(ZImageModes, GuidedImageMatchesDiffusersInEveryMode) {
  const GoldenFile g("z_image", "cfg_cat_64x64_s1");
  for (ExecutionMode mode : {ExecutionMode::Fuse, ExecutionMode::Compile, ExecutionMode::CompileBlocks}) {
    ZImagePipeline pipe = load_z_image(g);
    reset_counters();
    expect_golden_image(in_mode(pipe, mode, g.request()), g, execution_mode_name(mode));
    if (mode == ExecutionMode::Compile) {
      // The prompt pads to 32 tokens, the negative prompt to 64: one program each, reused by every step.
      EXPECT_EQ(counters().graphs_compiled, 2);
      EXPECT_EQ(counters().graph_cache_hits, 2 * *g.request().num_inference_steps - 2);
    }
  }
}

TEST(ZImageModes, Bfloat16TurboAndEditingInCompiledBlocks) {
  const GoldenFile bf16("z_image", "bf16_cat_64x64_s0");
  ZImagePipeline pipe = load_z_image(bf16);
  const PipelineOutput out = in_mode(pipe, ExecutionMode::CompileBlocks, bf16.request());
  EXPECT_LE(testing::mean_level_difference(out.images[0].pixels, bf16["image_u8"].select(0, 0)), 2.0);

  const GoldenFile i2i("z_image", "img2img_80x64_s4");
  auto edit = ZImageImg2ImgPipeline::from_pretrained(testing::data_path("models/z-image-tiny"));
  expect_golden_image(in_mode(edit, ExecutionMode::CompileBlocks, i2i.request()), i2i,
                      "img2img compile-blocks");
  const GoldenFile inpaint("z_image", "inpaint_80x64_s5");
  auto repaint = ZImageInpaintPipeline::from_pretrained(testing::data_path("models/z-image-tiny"));
  expect_golden_image(in_mode(repaint, ExecutionMode::Fuse, inpaint.request()), inpaint, "inpaint fuse");
}

TEST(ZImageModes, EveryOffloadGivesTheResidentImage) {
  const GoldenFile g("z_image", "cfg_norm_trunc_48x80_s2");
  const auto offloaded = [&](const std::function<void(ZImagePipeline&)>& offload, const char* what) {
    ZImagePipeline pipe = load_z_image(g);
    offload(pipe);
    expect_golden_image(pipe(g.request()), g, what);
  };
  offloaded([](ZImagePipeline& p) { p.enable_model_cpu_offload(); }, "model offload");
  offloaded([](ZImagePipeline& p) { p.enable_sequential_cpu_offload(); }, "sequential offload");
  offloaded([](ZImagePipeline& p) { p.enable_group_offload({.blocks_per_group = 1, .prefetch = true}); },
            "group offload");
  offloaded(
      [](ZImagePipeline& p) {
        p.enable_group_offload({.blocks_per_group = 1});
        p.configure({.mode = ExecutionMode::CompileBlocks});
      },
      "group offload, compiled blocks");
}

}  // namespace
}  // namespace kiln
