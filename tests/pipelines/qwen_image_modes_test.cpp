// Qwen-Image in every execution mode and under every offload on the CPU: diffusers' image
// (tools/goldens/qwen_image.py) within one 8-bit level, as strict eager gives it
// (qwen_image_pipeline_test.cpp). True CFG's two calls a step have texts of different lengths (the prompt's
// and the negative prompt's), each its own compiled program in compile mode.
#include <gtest/gtest.h>

#include <functional>
#include <optional>

#include "kiln/families/qwen_image/qwen_image_pipeline.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/eager_mode.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::GoldenFile;

QwenImagePipeline load_qwen_image(const GoldenFile& g) {
  return QwenImagePipeline::from_pretrained(testing::data_path("models/" + g.meta("model")),
                                            {.dtype = g.meta("dtype") == "bfloat16" ? bfloat16 : float32});
}

template <class Pipeline>
PipelineOutput in_mode(Pipeline& pipe, ExecutionMode mode, const PipelineRequest& request) {
  pipe.configure({.mode = mode});
  std::optional<EagerModeGuard> fuse;
  if (mode == ExecutionMode::Fuse) fuse.emplace(EagerMode::DeferAndFuse);
  return pipe(request);
}

TEST(QwenImageModes, GuidedImagesMatchDiffusersInEveryMode) {
  const GoldenFile g("qwen_image", "cfg_48x80_s1");
  for (ExecutionMode mode : {ExecutionMode::Fuse, ExecutionMode::Compile, ExecutionMode::CompileBlocks}) {
    QwenImagePipeline pipe = load_qwen_image(g);
    reset_counters();
    testing::expect_images_match(in_mode(pipe, mode, g.request()), g);
    if (mode == ExecutionMode::Compile) {
      // Both texts are cut at 64 tokens: one program serves the cond and the uncond calls of every step.
      EXPECT_EQ(counters().graphs_compiled, 1) << execution_mode_name(mode);
      EXPECT_EQ(counters().graph_cache_hits, 2 * *g.request().num_inference_steps - 1);
    }
  }
}

TEST(QwenImageModes, MaskedPromptListsAndBfloat16InCompiledBlocks) {
  const GoldenFile list("qwen_image", "list_cfg_64x64_s2");
  QwenImagePipeline pipe = load_qwen_image(list);
  testing::expect_images_match(in_mode(pipe, ExecutionMode::CompileBlocks, list.request()), list);
  const GoldenFile bf16("qwen_image", "bf16_cfg_64x64_s1");
  QwenImagePipeline half = load_qwen_image(bf16);
  const PipelineOutput out = in_mode(half, ExecutionMode::CompileBlocks, bf16.request());
  EXPECT_LE(testing::mean_level_difference(out.images[0].pixels, bf16["image_u8"].select(0, 0)), 2.0);
}

TEST(QwenImageModes, EveryOffloadGivesTheResidentImage) {
  const GoldenFile g("qwen_image", "cfg_48x80_s1");
  const auto offloaded = [&](const std::function<void(QwenImagePipeline&)>& offload) {
    QwenImagePipeline pipe = load_qwen_image(g);
    offload(pipe);
    testing::expect_images_match(pipe(g.request()), g);
  };
  offloaded([](QwenImagePipeline& p) { p.enable_model_cpu_offload(); });
  offloaded([](QwenImagePipeline& p) { p.enable_sequential_cpu_offload(); });
  offloaded([](QwenImagePipeline& p) { p.enable_group_offload({.blocks_per_group = 1, .prefetch = true}); });
  offloaded([](QwenImagePipeline& p) {
    p.enable_group_offload({.blocks_per_group = 1});
    p.configure({.mode = ExecutionMode::CompileBlocks});
  });
}

}  // namespace
}  // namespace kiln
