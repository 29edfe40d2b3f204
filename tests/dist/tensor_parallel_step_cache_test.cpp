// Step caches under tensor parallelism. First Block Cache: every rank takes rank 0's decision (a broadcast),
// which is diffusers' (tools/goldens/step_cache.py), and the split pipeline draws the one-rank image, true
// CFG's two contexts included. Pyramid Attention Broadcast and FasterCache decide from the schedule alone
// (the timestep and each attention's count, replicated on every rank): the split pipeline computes and reuses
// each attention as diffusers' hooks did (tools/goldens/step_cache_attention.py) and draws the one-rank
// image.
#include <gtest/gtest.h>

#include <vector>

#include "kiln/dist/device_mesh.h"
#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/nn/step_cache.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

// The golden's call with its cache on one rank and split over 2 (the transformer and T5, as --tp 2 splits
// them): both images and the split transformer's decisions.
struct OneAndTwoRanks {
  Image one, two;
  std::vector<nn::StepCache::Decision> decisions;
};

OneAndTwoRanks run_on_one_and_two_ranks(const testing::GoldenFile& g) {
  PipelineRequest request = g.request();
  request.cache = g.meta("cache");
  const std::string model = testing::data_path("models/" + g.meta("model"));
  auto one = FluxPipeline::from_pretrained(model);
  OneAndTwoRanks out{.one = one(request).images.front()};
  const dist::TensorParallelConfig parallel{.mesh = dist::DeviceMesh("cpu", {2})};
  PipelineLoadOptions options;
  options.parallel_config = {{"transformer", parallel}, {"text_encoder_2", parallel}};
  auto split = FluxPipeline::from_pretrained(model, options);
  out.two = split(request).images.front();
  out.decisions = split.transformer().step_cache()->decisions();
  return out;
}

TEST(TensorParallelPipeline, FirstBlockCacheTakesTheSameDecisionsOnEveryRank) {
  const testing::GoldenFile g("step_cache", "fbc_flux_dev_true_cfg_64x64_s33");
  const OneAndTwoRanks run = run_on_one_and_two_ranks(g);
  const Image &expected = run.one, &image = run.two;
  const std::vector<int64_t> computed = g["computed"].to_vector<int64_t>();
  const auto& decisions = run.decisions;
  ASSERT_EQ(decisions.size(), computed.size());
  for (size_t i = 0; i < computed.size(); ++i)
    EXPECT_EQ(decisions[i].computed, computed[i] != 0) << "evaluation " << i;
  EXPECT_LE(testing::max_level_difference(image, expected), 1);
  EXPECT_EQ(image.metadata.at("cache_reused"), expected.metadata.at("cache_reused"));
}

TEST(TensorParallelPipeline, AttentionCachesTakeTheSameDecisionsOnEveryRank) {
  for (const char* name : {"pab_flux_dev_64x64_s91", "faster_flux_dev_64x64_s95"}) {
    const testing::GoldenFile g("step_cache_attention", name);
    const OneAndTwoRanks run = run_on_one_and_two_ranks(g);
    const Image &expected = run.one, &image = run.two;
    const Tensor modules = g["modules_computed"];
    const std::vector<int64_t> ran = modules.to_vector<int64_t>();
    const auto& decisions = run.decisions;
    ASSERT_EQ(decisions.size(), static_cast<size_t>(modules.size(0))) << name;
    for (int64_t e = 0; e < modules.size(0); ++e) {
      int64_t computed = 0;
      for (int64_t m = 0; m < modules.size(1); ++m) computed += ran[e * modules.size(1) + m];
      EXPECT_EQ(decisions[e].attentions_computed, computed) << name << " evaluation " << e;
    }
    EXPECT_LE(testing::max_level_difference(image, expected), 1) << name;
    EXPECT_GE(testing::share_within_one_level(image.pixels, g["image_u8"]), 0.99) << name;
    EXPECT_EQ(image.metadata.at("cache_reused"), expected.metadata.at("cache_reused")) << name;
  }
}

}  // namespace
}  // namespace kiln
