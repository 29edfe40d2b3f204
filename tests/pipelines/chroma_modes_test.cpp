// Chroma in every execution mode and under every offload on the CPU: diffusers' image
// (tools/goldens/chroma.py) within one 8-bit level, as strict eager gives it (chroma_pipeline_test.cpp). The
// compiled modes trace the attention mask's bias as an input of each block's program; offloading streams the
// blocks the approximator's modulation feeds. On a PJRT device: tests/devices/families_on_device_test.cpp;
// split over ranks: tests/dist/tensor_parallel_chroma_test.cpp.
#include <gtest/gtest.h>

#include <optional>

#include "kiln/families/chroma/chroma_pipeline.h"
#include "kiln/families/chroma/chroma_transformer.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/eager_mode.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::GoldenFile;

ChromaPipeline load_chroma(const GoldenFile& g) {
  return ChromaPipeline::from_pretrained(testing::data_path("models/" + g.meta("model")),
                                         {.dtype = g.meta("dtype") == "bfloat16" ? bfloat16 : float32});
}

void expect_golden_image(const PipelineOutput& out, const GoldenFile& g, const std::string& what) {
  ASSERT_EQ(out.images.size(), 1u) << what;
  EXPECT_GE(testing::share_within_one_level(out.images[0].pixels, g["image_u8"].select(0, 0)), 0.99) << what;
}

PipelineOutput in_mode(ChromaPipeline& pipe, ExecutionMode mode, const PipelineRequest& request) {
  pipe.configure({.mode = mode});
  std::optional<EagerModeGuard> fuse;
  if (mode == ExecutionMode::Fuse) fuse.emplace(EagerMode::DeferAndFuse);
  return pipe(request);
}

TEST(ChromaModes, GuidedImageMatchesDiffusersInEveryMode) {
  const GoldenFile g("chroma", "cfg_cat_64x64_s0");
  for (ExecutionMode mode : {ExecutionMode::Fuse, ExecutionMode::Compile, ExecutionMode::CompileBlocks}) {
    ChromaPipeline pipe = load_chroma(g);
    reset_counters();
    expect_golden_image(in_mode(pipe, mode, g.request()), g, execution_mode_name(mode));
    if (mode == ExecutionMode::Compile) {
      // One program for the image's shape and the mask: both guidance calls of every step reuse it.
      EXPECT_EQ(counters().graphs_compiled, 1);
      EXPECT_EQ(counters().graph_cache_hits, 2 * *g.request().num_inference_steps - 1);
    }
  }
}

TEST(ChromaModes, Bfloat16AndImageToImageInCompiledBlocks) {
  const GoldenFile bf16("chroma", "bf16_cat_64x64_s0");
  ChromaPipeline pipe = load_chroma(bf16);
  const PipelineOutput out = in_mode(pipe, ExecutionMode::CompileBlocks, bf16.request());
  EXPECT_LE(testing::mean_level_difference(out.images[0].pixels, bf16["image_u8"].select(0, 0)), 1.2);

  const GoldenFile i2i("chroma", "img2img_64x64_s3");
  auto edit = ChromaImg2ImgPipeline::from_pretrained(testing::data_path("models/chroma-tiny"));
  expect_golden_image(in_mode(edit, ExecutionMode::CompileBlocks, i2i.request()), i2i,
                      "img2img compile-blocks");
}

TEST(ChromaModes, EveryOffloadGivesTheResidentImage) {
  const GoldenFile g("chroma", "cfg_cat_64x64_s0");
  const auto offloaded = [&](const std::function<void(ChromaPipeline&)>& offload, const char* what) {
    ChromaPipeline pipe = load_chroma(g);
    offload(pipe);
    expect_golden_image(pipe(g.request()), g, what);
  };
  offloaded([](ChromaPipeline& p) { p.enable_model_cpu_offload(); }, "model offload");
  offloaded([](ChromaPipeline& p) { p.enable_sequential_cpu_offload(); }, "sequential offload");
  offloaded([](ChromaPipeline& p) { p.enable_group_offload({.blocks_per_group = 1, .prefetch = true}); },
            "group offload");
  offloaded(
      [](ChromaPipeline& p) {
        p.enable_group_offload({.blocks_per_group = 1});
        p.configure({.mode = ExecutionMode::CompileBlocks});
      },
      "group offload, compiled blocks");
}

TEST(ChromaModes, ALoraInCompiledBlocksGivesDiffusersImage) {
  const GoldenFile base("chroma", "cfg_cat_64x64_s0"), g("chroma", "lora_diffusers");
  ChromaPipeline pipe = load_chroma(base);
  pipe.load_lora_weights(testing::data_path("lora/chroma_diffusers.safetensors"), {.adapter_name = "a"});
  const PipelineOutput unfused = in_mode(pipe, ExecutionMode::CompileBlocks, base.request());
  EXPECT_GE(testing::share_within_one_level(unfused.images[0].pixels, g["image_u8"]), 0.99);
  // Fused into the weights: the same image.
  pipe.fuse_lora();
  const PipelineOutput fused = pipe(base.request());
  EXPECT_LE(testing::max_level_difference(fused.images[0], unfused.images[0]), 1);
}

}  // namespace
}  // namespace kiln
