// First Block Cache under tensor parallelism: every rank takes rank 0's decision (a broadcast), which is
// diffusers' (tools/goldens/step_cache.py), and the split pipeline draws the one-rank image, true CFG's two
// contexts included.
#include <gtest/gtest.h>

#include "kiln/dist/device_mesh.h"
#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/models/flux_transformer.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

TEST(TensorParallelPipeline, FirstBlockCacheTakesTheSameDecisionsOnEveryRank) {
  const testing::GoldenFile g("step_cache", "fbc_flux_dev_true_cfg_64x64_s33");
  PipelineRequest request = g.request();
  request.cache = g.meta("cache");
  const std::string model = testing::data_path("models/" + g.meta("model"));
  auto one = FluxPipeline::from_pretrained(model);
  const Image expected = one(request).images.front();
  const dist::TensorParallelConfig parallel{.mesh = dist::DeviceMesh("cpu", {2})};
  PipelineLoadOptions options;
  options.parallel_config = {{"transformer", parallel}, {"text_encoder_2", parallel}};
  auto split = FluxPipeline::from_pretrained(model, options);
  const Image image = split(request).images.front();
  const std::vector<int64_t> computed = g["computed"].to_vector<int64_t>();
  const auto& decisions = split.transformer().step_cache()->decisions();
  ASSERT_EQ(decisions.size(), computed.size());
  for (size_t i = 0; i < computed.size(); ++i)
    EXPECT_EQ(decisions[i].computed, computed[i] != 0) << "evaluation " << i;
  EXPECT_LE(testing::max_level_difference(image, expected), 1);
  EXPECT_EQ(image.metadata.at("cache_reused"), expected.metadata.at("cache_reused"));
}

}  // namespace
}  // namespace kiln
