// A call with an absurd size is refused by the pipeline's call validation, naming the argument and the limit,
// before any tensor is allocated (kiln/core/limits.h).
#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "kiln/core/device_runtime.h"
#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/families/flux2/flux2_pipeline.h"
#include "kiln/families/sd3/sd3_pipeline.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

// The allocations `f` makes on the CPU device (it is expected to throw before making any).
template <class F>
int64_t allocations_during(F&& f) {
  synchronize();  // work the loading queued (weight conversions) finishes first
  const int64_t before = memory_stats().allocations;
  f();
  synchronize();
  return memory_stats().allocations - before;
}

TEST(CallLimits, FluxPipelineRefusesAbsurdSizesBeforeAllocating) {
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-schnell"));
  EXPECT_EQ(allocations_during([&] {
              EXPECT_KILN_ERROR(pipe({.prompt = "x", .height = 1000000, .width = 32}),
                                "FluxPipeline: height 1000000 exceeds the maximum 16384");
            }),
            0);
  EXPECT_EQ(allocations_during([&] {
              EXPECT_KILN_ERROR(pipe({.prompt = std::string(10 << 20, 'a'), .height = 32, .width = 32}),
                                "FluxPipeline: prompt is 10485760 bytes, more than the maximum 65536");
            }),
            0);
  EXPECT_KILN_ERROR(pipe({.prompt = "x", .height = 32, .width = 32, .num_inference_steps = 0}),
                    "num_inference_steps 0 is below the minimum 1");
}

TEST(CallLimits, SD3PipelineRefusesAbsurdSizesBeforeAllocating) {
  auto pipe = StableDiffusion3Pipeline::from_pretrained(testing::data_path("models/sd3-tiny-medium"));
  EXPECT_EQ(allocations_during([&] {
              EXPECT_KILN_ERROR(pipe({.prompt = "x", .height = 32, .width = 1000000}),
                                "StableDiffusion3Pipeline: width 1000000 exceeds the maximum 16384");
            }),
            0);
  EXPECT_EQ(
      allocations_during([&] {
        EXPECT_KILN_ERROR(
            pipe({.prompt = "x", .negative_prompt = std::string(100000, 'b'), .height = 32, .width = 32}),
            "StableDiffusion3Pipeline: negative_prompt is 100000 bytes, more than the maximum 65536");
      }),
      0);
}

TEST(CallLimits, Flux2PipelinesRefuseAbsurdSizesBeforeAllocating) {
  auto pipe = Flux2KleinPipeline::from_pretrained(testing::data_path("models/flux2-tiny-klein-full"));
  EXPECT_EQ(allocations_during([&] {
              EXPECT_KILN_ERROR(pipe({.prompt = "x", .height = 1000000, .width = 64}),
                                "Flux2KleinPipeline: height 1000000 exceeds the maximum 16384");
            }),
            0);
  // Refused before the reference image is preprocessed (which would allocate its tensor).
  Image reference;
  reference.width = reference.height = 64;
  reference.pixels.assign(64 * 64 * 3, 128);
  EXPECT_EQ(allocations_during([&] {
              EXPECT_KILN_ERROR(pipe({.prompt = std::string(10 << 20, 'a'), .image = {reference}}),
                                "Flux2KleinPipeline: prompt is 10485760 bytes, more than the maximum 65536");
            }),
            0);
  EXPECT_EQ(allocations_during([&] {
              EXPECT_KILN_ERROR(pipe({.prompt = "x", .negative_prompt = std::string(100000, 'b')}),
                                "Flux2KleinPipeline: negative_prompt is 100000 bytes, more than the maximum "
                                "65536");
            }),
            0);
  EXPECT_KILN_ERROR(pipe({.prompt = "x", .height = 64, .width = 64, .num_inference_steps = 0}),
                    "num_inference_steps 0 is below the minimum 1");
}

}  // namespace
}  // namespace kiln
