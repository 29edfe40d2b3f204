// How a pipeline holds its weights (kiln/pipelines/weight_packing.h): the default rule, the budget as the
// command line spells it, and the image unchanged whether the weights are packed or read in place from the
// mapped checkpoint (issue #18).
#include "kiln/pipelines/weight_packing.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"
#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/eager_mode.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// A 32x32, 2-step call of the tiny FLUX.1-dev pipeline.
PipelineRequest tiny_call(const std::string& prompt, uint64_t seed) {
  return {.prompt = prompt,
          .height = 32,
          .width = 32,
          .num_inference_steps = 2,
          .guidance_scale = 3.5f,
          .generator = Generator(seed),
          .max_sequence_length = 16};
}

TEST(WeightPacking, DefaultPacksWhatFitsInHalfTheMachineAndNothingElse) {
  const WeightPackingPlan small = plan_weight_packing(12 * kGiB, std::nullopt, 24 * kGiB);
  EXPECT_FALSE(small.budget.has_value());
  EXPECT_NE(small.describe().find("all"), std::string::npos) << small.describe();
  // A 32 GB FLUX.1-schnell folder on a 24 GiB machine: nothing pinned, everything from the page cache.
  const WeightPackingPlan big = plan_weight_packing(30 * kGiB, std::nullopt, 24 * kGiB);
  ASSERT_TRUE(big.budget.has_value());
  EXPECT_EQ(*big.budget, 0);
  EXPECT_NE(big.describe().find("none"), std::string::npos) << big.describe();
  EXPECT_NE(big.describe().find("exceed half"), std::string::npos) << big.describe();
  const WeightPackingPlan just_over = plan_weight_packing(12 * kGiB + 1, std::nullopt, 24 * kGiB);
  EXPECT_EQ(just_over.budget, std::optional<int64_t>(0));
}

TEST(WeightPacking, ARequestedBudgetWins) {
  EXPECT_EQ(plan_weight_packing(30 * kGiB, 8 * kGiB, 24 * kGiB).budget, std::optional<int64_t>(8 * kGiB));
  EXPECT_FALSE(plan_weight_packing(30 * kGiB, kAllWeightsPacked, 24 * kGiB).budget.has_value());
  EXPECT_EQ(plan_weight_packing(1 * kGiB, 0, 24 * kGiB).budget, std::optional<int64_t>(0));
  EXPECT_TRUE(plan_weight_packing(1 * kGiB, 0, 24 * kGiB).requested);
}

TEST(WeightPacking, MachineMemoryIsPositiveAndAtMostPhysical) {
  const int64_t m = machine_memory_bytes();
  EXPECT_GT(m, 0);
  EXPECT_LE(m, static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE)));
}

TEST(WeightPacking, ParsesSizesAsTheCommandLineWritesThem) {
  EXPECT_EQ(parse_byte_budget("12GiB", "--f"), 12 * kGiB);
  EXPECT_EQ(parse_byte_budget("512MiB", "--f"), 512 * (int64_t{1} << 20));
  EXPECT_EQ(parse_byte_budget("8GB", "--f"), int64_t{8'000'000'000});
  EXPECT_EQ(parse_byte_budget("1.5GiB", "--f"), 3 * kGiB / 2);
  EXPECT_EQ(parse_byte_budget("4096", "--f"), 4096);
  EXPECT_EQ(parse_byte_budget("all", "--f"), kAllWeightsPacked);
  EXPECT_EQ(parse_byte_budget("none", "--f"), 0);
  for (const char* bad : {"", "GiB", "12XB", "-1GiB", "twelve", "1e400", "12 GiB"}) {
    try {
      parse_byte_budget(bad, "--packed-weights");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--packed-weights"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("12GiB"), std::string::npos) << e.what();
    }
  }
}

// The tiny FLUX.1-dev pipeline stored in bf16 (mapped weights, packed by default): with no packed copies at
// all the image is the same, and nothing is packed.
TEST(WeightPacking, PipelineImageIsTheSameWithWeightsReadInPlace) {
  const std::optional<int64_t> saved = packed_weight_budget();
  const PipelineRequest call = tiny_call("a red circle", 3);
  const auto run = [&](std::optional<int64_t> budget, int64_t* packed) {
    PipelineLoadOptions options{.dtype = bfloat16};
    options.packed_weight_budget = budget;
    auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev-bf16"), options);
    const int64_t before = pipe.context().memory().packed_weight_bytes();
    auto out = pipe(call);
    synchronize();
    *packed = pipe.context().memory().packed_weight_bytes() - before;
    return out.images[0].pixels;
  };
  int64_t packed_default = 0, packed_none = 0;
  const std::vector<uint8_t> packed_image = run(std::nullopt, &packed_default);
  const std::vector<uint8_t> in_place_image = run(0, &packed_none);
  set_packed_weight_budget(saved);
  EXPECT_GT(packed_default, 0) << "the tiny bf16 model fits: its weights are packed by default";
  EXPECT_EQ(packed_none, 0);
  ASSERT_EQ(packed_image.size(), in_place_image.size());
  int differing = 0;
  for (size_t i = 0; i < packed_image.size(); ++i)
    differing += std::abs(static_cast<int>(packed_image[i]) - static_cast<int>(in_place_image[i])) > 1;
  EXPECT_EQ(differing, 0) << "values more than one 8-bit level apart";
}

// enable_model_cpu_offload: every component's packed copies are gone once the call returns, the image is the
// same as without offloading, and a second call (reading the weights from the files again) gives it again.
TEST(ModelCpuOffload, ReleasesEveryComponentAndKeepsTheImage) {
  const PipelineRequest call = tiny_call("a blue square", 5);
  PipelineLoadOptions options{.dtype = bfloat16};
  options.packed_weight_budget = kAllWeightsPacked;
  const std::optional<int64_t> saved = packed_weight_budget();
  std::vector<uint8_t> resident_image;
  {
    auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev-bf16"), options);
    resident_image = pipe(call).images[0].pixels;
  }
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev-bf16"), options);
  pipe.enable_model_cpu_offload();
  EXPECT_TRUE(pipe.model_cpu_offload_enabled());
  const int64_t before = pipe.context().memory().packed_weight_bytes();
  EXPECT_EQ(pipe(call).images[0].pixels, resident_image);
  EXPECT_EQ(pipe.context().memory().packed_weight_bytes(), before)
      << "a component kept packed copies after the call";
  EXPECT_EQ(pipe(call).images[0].pixels, resident_image);
  set_packed_weight_budget(saved);
}

// set_memory_budget picks the coarsest offload under the budget, and the image does not change with it.
TEST(MemoryBudget, PicksTheCoarsestOffloadAndKeepsTheImage) {
  const PipelineRequest call = tiny_call("a white circle", 9);
  PipelineLoadOptions options{.dtype = bfloat16};
  const std::optional<int64_t> saved_packed = packed_weight_budget();
  const auto load = [&] {
    return FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev-bf16"), options);
  };
  std::vector<uint8_t> unbudgeted;
  OffloadPlan probe;
  {
    auto pipe = load();
    unbudgeted = pipe(call).images[0].pixels;
    probe = pipe.set_memory_budget(int64_t{1} << 40);
    EXPECT_EQ(probe.mode, OffloadMode::None);
  }
  ASSERT_GT(probe.largest_component_bytes, probe.largest_tensor_bytes);
  ASSERT_GT(probe.weight_bytes, probe.largest_component_bytes);
  for (const auto& [budget, mode] : {std::pair{probe.largest_component_bytes, OffloadMode::Model},
                                     std::pair{probe.largest_tensor_bytes, OffloadMode::Sequential}}) {
    auto pipe = load();
    const OffloadPlan plan = pipe.set_memory_budget(budget);
    EXPECT_EQ(plan.mode, mode) << plan.describe();
    EXPECT_TRUE(pipe.model_cpu_offload_enabled());
    EXPECT_EQ(pipe(call).images[0].pixels, unbudgeted) << plan.describe();
  }
  {
    auto pipe = load();
    try {
      pipe.set_memory_budget(probe.largest_tensor_bytes - 1);
      ADD_FAILURE() << "a budget below the largest weight was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(probe.largest_tensor), std::string::npos) << e.what();
    }
  }
  set_resident_weight_budget(std::nullopt);
  set_packed_weight_budget(saved_packed);
}

// Model offload releases weights between components, outside any forward: in every execution mode the image
// with offloading equals the image without it in that mode, and no packed copy survives the call.
TEST(ModelCpuOffload, EveryExecutionModeKeepsItsImage) {
  const PipelineRequest call = tiny_call("a green triangle", 7);
  PipelineLoadOptions options{.dtype = bfloat16};
  options.packed_weight_budget = kAllWeightsPacked;
  const std::optional<int64_t> saved = packed_weight_budget();
  for (const std::string mode : {"fuse", "compile", "compile-blocks"}) {
    const auto run = [&](bool offload) {
      auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev-bf16"), options);
      if (mode == "compile") pipe.transformer().compile({.fullgraph = true, .dynamic = false});
      if (mode == "compile-blocks") pipe.transformer().compile_repeated_blocks();
      if (offload) pipe.enable_model_cpu_offload();
      std::optional<EagerModeGuard> fuse;
      if (mode == "fuse") fuse.emplace(EagerMode::DeferAndFuse);
      const int64_t before = pipe.context().memory().packed_weight_bytes();
      std::vector<uint8_t> pixels = pipe(call).images[0].pixels;
      if (offload) {
        EXPECT_EQ(pipe.context().memory().packed_weight_bytes(), before)
            << mode << ": packed copies survived the call";
      }
      return pixels;
    };
    EXPECT_EQ(run(true), run(false)) << mode;
  }
  set_packed_weight_budget(saved);
}

}  // namespace
}  // namespace kiln
