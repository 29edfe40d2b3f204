// Whole pipelines with the transformer and the large text encoder (T5, FLUX.2's) split over two ranks draw
// the one-rank image (within one 8-bit level) from the same seed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "kiln/dist/device_mesh.h"
#include "kiln/dist/process_group.h"
#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/families/flux2/flux2_pipeline.h"
#include "kiln/families/sd3/sd3_pipeline.h"
#include "kiln/io/safetensors.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "support/pipeline_comparison.h"
#include "support/pjrt_devices.h"
#include "support/test_data.h"

namespace kiln {
namespace {

PipelineLoadOptions split_over_ranks(const std::string& t5_component) {
  const dist::TensorParallelConfig parallel{.mesh = dist::DeviceMesh("cpu", {2})};
  PipelineLoadOptions options;
  options.parallel_config = {{"transformer", parallel}, {t5_component, parallel}};
  return options;
}

// The call both FLUX.1 cases draw, with the one-rank run's seed.
PipelineRequest tiny_flux_call() {
  return {.prompt = "a cat",
          .height = 64,
          .width = 64,
          .num_inference_steps = 3,
          .generator = Generator(7),
          .max_sequence_length = 16};
}

TEST(TensorParallelPipeline, FluxDrawsTheOneRankImage) {
  const std::string model = testing::data_path("models/flux-tiny-dev");
  PipelineRequest call = tiny_flux_call();
  auto one = FluxPipeline::from_pretrained(model);
  const Image expected = one(call).images.front();
  call.generator = Generator(7);
  auto split = FluxPipeline::from_pretrained(model, split_over_ranks("text_encoder_2"));
  EXPECT_LE(testing::max_level_difference(split(call).images.front(), expected), 1);
}

// One process per device on PJRT devices too: rank r's shard on xla-cpu:r, the collectives staged through the
// host over MPI (backends/pjrt/collective_kernels.h), the one-rank CPU image.
TEST(TensorParallelPipeline, FluxOnPjrtDevicesDrawsTheOneRankImage) {
  KILN_SKIP_WITHOUT_PJRT();
  const std::string model = testing::data_path("models/flux-tiny-dev");
  PipelineRequest call = tiny_flux_call();
  auto one = FluxPipeline::from_pretrained(model);
  const Image expected = one(call).images.front();
  call.generator = Generator(7);
  auto split = FluxPipeline::from_pretrained(model, split_over_ranks("text_encoder_2"));
  const Device mine(DeviceType::XlaCpu, dist::rank());
  split.to(mine);
  EXPECT_EQ(split.device(), mine);
  EXPECT_LE(testing::max_level_difference(split(call).images.front(), expected), 1);
}

TEST(TensorParallelPipeline, StableDiffusion3DrawsTheOneRankImage) {
  const std::string model = testing::data_path("models/sd3-tiny-medium");
  PipelineRequest call;
  call.prompt = "a cat";
  call.negative_prompt = "blurry";
  call.height = 64;
  call.width = 64;
  call.num_inference_steps = 3;
  call.guidance_scale = 4.5f;
  call.max_sequence_length = 16;
  call.generator = Generator(5);
  auto one = StableDiffusion3Pipeline::from_pretrained(model);
  const Image expected = one(call).images.front();
  call.generator = Generator(5);
  auto split = StableDiffusion3Pipeline::from_pretrained(model, split_over_ranks("text_encoder_3"));
  EXPECT_LE(testing::max_level_difference(split(call).images.front(), expected), 1);
}

TEST(TensorParallelPipeline, Flux2DrawsTheOneRankImage) {
  // A reference image and klein's classifier-free guidance (two transformer passes per step).
  io::SafetensorsFile g(testing::data_path("goldens/flux2/klein_cfg_ref1_64x64_s2.safetensors"));
  const std::string model = testing::data_path("models/flux2-tiny-klein");
  PipelineRequest call;
  call.prompt_embeds = g.tensor("prompt_embeds");
  call.negative_prompt_embeds = g.tensor("negative_prompt_embeds");
  call.image = {Image::load(testing::data_path("goldens/flux2/ref_a.png"))};
  call.height = 64;
  call.width = 64;
  call.num_inference_steps = 2;
  call.guidance_scale = 3.5f;
  call.generator = Generator(2);
  auto one = Flux2KleinPipeline::from_pretrained(model);
  const Image expected = one(call).images.front();
  call.generator = Generator(2);
  const dist::TensorParallelConfig parallel{.mesh = dist::DeviceMesh("cpu", {2})};
  PipelineLoadOptions options;
  options.parallel_config = {{"transformer", parallel}};
  auto split = Flux2KleinPipeline::from_pretrained(model, options);
  EXPECT_LE(testing::max_level_difference(split(call).images.front(), expected), 1);
  // The VAE stays replicated.
  options.parallel_config.emplace("vae", parallel);
  EXPECT_THROW(Flux2KleinPipeline::from_pretrained(model, options), Error);
}

TEST(TensorParallelPipeline, Flux2FromAPromptDrawsTheOneRankImage) {
  // The text encoder (Qwen3: q/k/v and gate/up column, o and down row) and the transformer split, klein's
  // guidance with its negative prompt; the prompt embeddings and the image equal one rank's.
  const std::string model = testing::data_path("models/flux2-tiny-klein-full");
  PipelineRequest call;
  call.prompt = "a red fox in the snow";
  call.negative_prompt = "blurry";
  call.height = 48;
  call.width = 64;
  call.num_inference_steps = 2;
  call.guidance_scale = 4.0f;
  call.max_sequence_length = 40;
  call.generator = Generator(3);
  auto one = Flux2KleinPipeline::from_pretrained(model);
  const Image expected = one(call).images.front();
  call.generator = Generator(3);
  auto split = Flux2KleinPipeline::from_pretrained(model, split_over_ranks("text_encoder"));
  EXPECT_TRUE(testing::rel_max_error_within(split.encode_prompt(call.prompt, Tensor(), 1, 40).first,
                                            one.encode_prompt(call.prompt, Tensor(), 1, 40).first, 1e-5));
  EXPECT_LE(testing::max_level_difference(split(call).images.front(), expected), 1);
}

// Concurrent calls under tensor parallelism: 4 threads per rank, each with its own seed, call one split
// pipeline at once, in whatever order each rank's threads arrive; every rank runs the calls in rank 0's order
// (kiln/dist/call_sequencer.h), so each thread gets the image its request gives alone, in every execution
// mode (the collectives are kernels on the stream in eager, graph nodes in the others).
TEST(TensorParallelPipeline, FourThreadsPerRankGetTheirSingleRunImages) {
  const std::string model = testing::data_path("models/flux-tiny-dev");
  for (const ExecutionMode mode :
       {ExecutionMode::Eager, ExecutionMode::Fuse, ExecutionMode::Compile, ExecutionMode::CompileBlocks}) {
    SCOPED_TRACE(execution_mode_name(mode));
    PipelineLoadOptions options;
    options.tensor_parallel = 2;
    auto pipe = DiffusionPipeline::from_pretrained(model, options);
    pipe->configure({.mode = mode});
    const auto call = [](int i) {
      return PipelineRequest{.prompt = i % 2 ? "a cat" : "a dog",
                             .height = 32,
                             .width = 32,
                             .num_inference_steps = 2,
                             .generator = Generator(20 + i),
                             .max_sequence_length = 16};
    };
    std::vector<std::vector<uint8_t>> alone(4), together(4);
    for (int i = 0; i < 4; ++i) alone[i] = (*pipe)(call(i)).images.front().pixels;
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i)
      threads.emplace_back([&, i] {
        // Each rank's threads start in a different order.
        std::this_thread::sleep_for(std::chrono::milliseconds(dist::rank() == 0 ? 5 * i : 5 * (3 - i)));
        try {
          together[i] = (*pipe)(call(i)).images.front().pixels;
        } catch (const std::exception& e) {
          ADD_FAILURE() << "thread " << i << ": " << e.what();
        }
      });
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < 4; ++i) EXPECT_EQ(together[i], alone[i]) << "thread " << i;
  }
}

// A call cancelled on one rank stops at the same step on every rank (the ranks agree at each step), and the
// next call runs normally.
TEST(TensorParallelPipeline, CancellingOnOneRankStopsEveryRank) {
  PipelineLoadOptions options;
  options.tensor_parallel = 2;
  auto pipe = DiffusionPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"), options);
  PipelineRequest call{.prompt = "a cat",
                       .height = 32,
                       .width = 32,
                       .num_inference_steps = 4,
                       .generator = Generator(3),
                       .max_sequence_length = 16};
  const std::vector<uint8_t> alone = (*pipe)(call).images.front().pixels;
  PipelineRequest cancelled = call;
  cancelled.cancel = CancellationToken();  // a copy of a request shares its token
  int steps = 0;
  cancelled.callback_on_step_end = [&](StepState& s) {
    ++steps;
    if (dist::rank() == 1 && s.step == 0) cancelled.cancel.cancel();
  };
  EXPECT_THROW((*pipe)(cancelled), Cancelled);
  EXPECT_EQ(steps, 1);
  EXPECT_EQ((*pipe)(call).images.front().pixels, alone);
}

TEST(TensorParallelPipeline, ClipCannotBeSplit) {
  PipelineLoadOptions options = split_over_ranks("text_encoder_2");
  options.parallel_config.emplace("text_encoder", options.parallel_config.at("transformer"));
  try {
    FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"), options);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("component 'text_encoder' cannot be split"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
