// Whole pipelines split over in-process ranks (kiln/dist/local_ranks.h), one per device of the test device
// type (xla-cpu unless KILN_TEST_DEVICE says otherwise): the transformer and the large text encoder sharded
// by their tensor-parallel plans, each device holding only its shards, the collectives inside executables
// across the devices. Every rank draws the one-rank image (within one 8-bit level), on 2 and 4 devices and in
// each execution mode, for FLUX.1, SD3.5, FLUX.2 and SDXL's UNet.
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/dist/device_mesh.h"
#include "kiln/dist/local_ranks.h"
#include "kiln/dist/process_group.h"
#include "kiln/io/safetensors.h"
#include "kiln/pipelines/diffusion_pipeline.h"
#include "support/pipeline_comparison.h"
#include "support/pjrt_devices.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct Case {
  std::string model;
  std::vector<std::string> split;  // the components the plan shards
  PipelineRequest request;
};

Case flux() {
  return {
      "flux-tiny-dev",
      {"transformer", "text_encoder_2"},
      {.prompt = "a cat", .height = 64, .width = 64, .num_inference_steps = 3, .max_sequence_length = 16}};
}

Case sd3() {
  PipelineRequest r{.prompt = "a cat", .height = 64, .width = 64, .num_inference_steps = 3};
  r.negative_prompt = "blurry";
  r.guidance_scale = 4.5f;
  r.max_sequence_length = 16;
  return {"sd3-tiny-medium", {"transformer", "text_encoder_3"}, r};
}

Case flux2() {
  PipelineRequest r{.prompt = "a red fox in the snow", .height = 48, .width = 64, .num_inference_steps = 2};
  r.negative_prompt = "blurry";
  r.guidance_scale = 4.0f;
  r.max_sequence_length = 40;
  return {"flux2-tiny-klein-full", {"transformer", "text_encoder"}, r};
}

// SDXL's UNet (its transformer blocks' heads and feed-forward; convolutions whole on each device), guided.
Case sdxl() {
  PipelineRequest r{.prompt = "a red circle", .height = 32, .width = 32, .num_inference_steps = 3};
  r.negative_prompt = "blurry";
  return {"sdxl-tiny", {"unet"}, r};
}

// kiln-shapes-64 (the README's model): 4 heads, so it splits 4 ways (the tiny test models have 2).
Case shapes() {
  PipelineRequest r{.prompt = "a big yellow triangle at the top, on a blue background",
                    .height = 64,
                    .width = 64,
                    .num_inference_steps = 3};
  r.guidance_scale = 0.0f;
  r.max_sequence_length = 40;
  return {"../../../models/kiln-shapes-64", {"transformer", "text_encoder_2"}, r};
}

Image one_rank_image(const Case& c, uint64_t seed) {
  auto pipe = DiffusionPipeline::from_pretrained(testing::data_path("models/" + c.model));
  PipelineRequest call = c.request;
  call.generator = Generator(seed);
  return (*pipe)(call).images.front();
}

// Each rank's image, the pipeline split over `ranks` threads on the test devices 0..ranks-1 in `mode`.
std::vector<Image> split_images(const Case& c, int ranks, ExecutionMode mode, uint64_t seed) {
  std::vector<Image> images(static_cast<size_t>(ranks));
  dist::run_local_ranks(ranks, [&](int rank) {
    const dist::TensorParallelConfig parallel{.mesh = dist::DeviceMesh(testing::test_device_kind(), {ranks})};
    PipelineLoadOptions options;
    for (const std::string& component : c.split) options.parallel_config.emplace(component, parallel);
    auto pipe = DiffusionPipeline::from_pretrained(testing::data_path("models/" + c.model), options);
    pipe->to(testing::test_device(rank));
    pipe->configure({.mode = mode});
    PipelineRequest call = c.request;
    call.generator = Generator(seed);
    images[static_cast<size_t>(rank)] = (*pipe)(call).images.front();
  });
  return images;
}

void expect_every_rank_draws(const Case& c, int ranks, ExecutionMode mode) {
  KILN_SKIP_WITHOUT_TEST_DEVICES(ranks);
  const Image expected = one_rank_image(c, 7);
  const std::vector<Image> images = split_images(c, ranks, mode, 7);
  for (int r = 0; r < ranks; ++r)
    EXPECT_LE(testing::max_level_difference(images[static_cast<size_t>(r)], expected), 1)
        << c.model << " on " << ranks << " devices, " << execution_mode_name(mode) << ", rank " << r;
}

TEST(LocalRanksPipeline, FluxOnTwoDevicesInEveryMode) {
  for (ExecutionMode mode : {ExecutionMode::Eager, ExecutionMode::Fuse, ExecutionMode::CompileBlocks})
    expect_every_rank_draws(flux(), 2, mode);
}

TEST(LocalRanksPipeline, FluxOnFourDevices) {
  expect_every_rank_draws(shapes(), 4, ExecutionMode::Compile);
}

TEST(LocalRanksPipeline, StableDiffusion3OnTwoDevices) {
  expect_every_rank_draws(sd3(), 2, ExecutionMode::Eager);
}

TEST(LocalRanksPipeline, StableDiffusionXLOnTwoDevices) {
  expect_every_rank_draws(sdxl(), 2, ExecutionMode::CompileBlocks);
}

TEST(LocalRanksPipeline, Flux2FromAPromptOnTwoDevices) {
  expect_every_rank_draws(flux2(), 2, ExecutionMode::Fuse);
}

// A call cancelled on rank 0 alone (kiln serve's DELETE reaches rank 0 only) stops every rank at the same
// step (the ranks agree at each step), so the next call's collectives meet their peers and it draws the
// image.
TEST(LocalRanksPipeline, ACallCancelledOnOneRankStopsEveryRankAtTheSameStep) {
  KILN_SKIP_WITHOUT_TEST_DEVICES(2);
  const Case c = flux();
  std::vector<std::string> stopped(2);
  std::vector<Image> images(2);
  dist::run_local_ranks(2, [&](int rank) {
    const dist::TensorParallelConfig parallel{.mesh = dist::DeviceMesh(testing::test_device_kind(), {2})};
    PipelineLoadOptions options;
    for (const std::string& component : c.split) options.parallel_config.emplace(component, parallel);
    auto pipe = DiffusionPipeline::from_pretrained(testing::data_path("models/" + c.model), options);
    pipe->to(testing::test_device(rank));
    PipelineRequest call = c.request;
    call.generator = Generator(3);
    call.cancel = CancellationToken();
    call.callback_on_step_end = [&, rank, token = call.cancel](StepState& step) {
      if (rank == 0 && step.step == 0) token.cancel();
    };
    try {
      (*pipe)(call);
    } catch (const Cancelled& e) {
      stopped[static_cast<size_t>(rank)] = e.what();
    }
    call = c.request;
    call.generator = Generator(7);
    images[static_cast<size_t>(rank)] = (*pipe)(call).images.front();
  });
  EXPECT_FALSE(stopped[0].empty());
  EXPECT_EQ(stopped[1], stopped[0]);  // the same place: "cancelled after denoising step 1 of 3"
  const Image expected = one_rank_image(c, 7);
  for (int r = 0; r < 2; ++r)
    EXPECT_LE(testing::max_level_difference(images[static_cast<size_t>(r)], expected), 1);
}

TEST(LocalRanksPipeline, AMeshLargerThanTheGroupIsRefused) {
  const std::string message =
      testing::error_message([] { dist::run_local_ranks(2, [](int) { dist::DeviceMesh("xla-cpu", {4}); }); });
  EXPECT_NE(message.find("a mesh of 4 devices needs 4 processes, but the process group has 2"),
            std::string::npos)
      << message;
  EXPECT_NE(testing::error_message([] { dist::DeviceMesh("xla-cpu:1", {1}); }).find("is not a device type"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
