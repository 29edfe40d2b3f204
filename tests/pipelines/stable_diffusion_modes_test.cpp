// The UNet family in every execution mode and under every offload on the CPU: diffusers' image
// (tools/goldens/sd.py) within one 8-bit level, as strict eager gives it
// (stable_diffusion_pipeline_test.cpp). Compiled, the UNet is one program per input signature; compiled
// blocks, one program per ResNet block and per transformer block shape, shared across the UNet's levels.
// Tensor parallelism is refused by name.
#include <gtest/gtest.h>

#include <optional>

#include "kiln/families/stable_diffusion/stable_diffusion_pipeline.h"
#include "kiln/families/stable_diffusion/stable_diffusion_xl_pipeline.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/eager_mode.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::GoldenFile;

PipelineOutput in_mode(DiffusionPipeline& pipe, ExecutionMode mode, const PipelineRequest& request) {
  pipe.configure({.mode = mode});
  std::optional<EagerModeGuard> fuse;
  if (mode == ExecutionMode::Fuse) fuse.emplace(EagerMode::DeferAndFuse);
  return pipe(request);
}

TEST(StableDiffusionModes, BothPipelinesMatchDiffusersInEveryMode) {
  for (const char* name : {"sd15_negative_48x80_s1", "sdxl_micro_cond_32x48_s3"}) {
    const GoldenFile g("sd", name);
    for (ExecutionMode mode : {ExecutionMode::Fuse, ExecutionMode::Compile, ExecutionMode::CompileBlocks}) {
      const std::unique_ptr<DiffusionPipeline> pipe = g.load();
      reset_counters();
      testing::expect_images_match(in_mode(*pipe, mode, g.text_request()), g);
      if (mode == ExecutionMode::Compile) {
        // One program for the whole guided UNet, reused by every later step.
        EXPECT_EQ(counters().graphs_compiled, 1) << name;
        EXPECT_EQ(counters().graph_cache_hits, std::stoi(g.meta("steps_run")) - 1) << name;
      }
    }
  }
}

TEST(StableDiffusionModes, EveryOffloadGivesTheResidentImage) {
  const GoldenFile g("sd", "sdxl_prompt2_negative_48x64_s1");
  const auto offloaded = [&](const std::function<void(DiffusionPipeline&)>& offload, const char* what) {
    const std::unique_ptr<DiffusionPipeline> pipe = g.load();
    offload(*pipe);
    SCOPED_TRACE(what);
    testing::expect_images_match((*pipe)(g.text_request()), g);
  };
  offloaded([](DiffusionPipeline& p) { p.enable_model_cpu_offload(); }, "model offload");
  offloaded([](DiffusionPipeline& p) { p.enable_sequential_cpu_offload(); }, "sequential offload");
  offloaded([](DiffusionPipeline& p) { p.enable_group_offload({.blocks_per_group = 2, .prefetch = true}); },
            "group offload");
}

// A LoCon (tools/goldens/sd_kohya_lora.py: pairs on the UNet's convolutions and time-embedding Linears),
// unfused, in every mode and under every offload: diffusers' image. Its pairs are inputs of the compiled
// programs, as a Linear's are: set_adapters again builds no program.
TEST(StableDiffusionModes, LoConInEveryModeAndOffload) {
  const GoldenFile g("sd", "lora_locon_sd15_unfused");
  PipelineRequest request = g.text_request();
  request.prompt = g.meta("prompt");
  const auto with_locon = [&] {
    std::unique_ptr<DiffusionPipeline> pipe = g.load();
    pipe->load_lora_weights(testing::data_path("lora/sd15_locon.safetensors"), {.adapter_name = "sd"});
    pipe->set_adapters({"sd"}, {0.7});
    return pipe;
  };
  for (ExecutionMode mode : {ExecutionMode::Fuse, ExecutionMode::Compile, ExecutionMode::CompileBlocks}) {
    SCOPED_TRACE(static_cast<int>(mode));
    const std::unique_ptr<DiffusionPipeline> pipe = with_locon();
    testing::expect_images_match(in_mode(*pipe, mode, request), g);
    if (mode == ExecutionMode::Compile) {
      // A new combined pair of the same ranks: the same program.
      pipe->set_adapters({"sd"}, {0.7});
      reset_counters();
      testing::expect_images_match((*pipe)(request), g);
      EXPECT_EQ(counters().graphs_compiled, 0);
    }
  }
  const auto offloaded = [&](const std::function<void(DiffusionPipeline&)>& offload, const char* what) {
    const std::unique_ptr<DiffusionPipeline> pipe = with_locon();
    offload(*pipe);
    SCOPED_TRACE(what);
    testing::expect_images_match((*pipe)(request), g);
  };
  offloaded([](DiffusionPipeline& p) { p.enable_model_cpu_offload(); }, "model offload");
  offloaded([](DiffusionPipeline& p) { p.enable_sequential_cpu_offload(); }, "sequential offload");
  offloaded([](DiffusionPipeline& p) { p.enable_group_offload({.blocks_per_group = 2, .prefetch = true}); },
            "group offload");
}

// The UNet splits over ranks (tests/dist/tensor_parallel_stable_diffusion_test.cpp); one process asked for 2
// ranks is told how to start them, before any weight loads.
TEST(StableDiffusionModes, TensorParallelismWithoutItsRanksIsRefused) {
  try {
    StableDiffusionXLPipeline::from_pretrained(testing::data_path("models/sdxl-tiny"),
                                               {.tensor_parallel = 2});
    ADD_FAILURE() << "--tp 2 was accepted in one process";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a mesh of 2 devices needs 2 processes"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
