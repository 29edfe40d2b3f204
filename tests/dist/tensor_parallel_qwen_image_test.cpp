// QwenImageTransformer2DModel split over two ranks (diffusers' _tp_plan: each block's q/k/v and feed-forward
// inputs column-parallel, its output projections row-parallel; the modulations, embedders and proj_out
// column-parallel and gathered) gives the one-rank output with the text mask, eager and compiled, and each
// rank holds about half the weights.
#include <gtest/gtest.h>

#include "kiln/dist/device_mesh.h"
#include "kiln/families/qwen_image/qwen_image_pipeline.h"
#include "kiln/families/qwen_image/qwen_image_transformer.h"
#include "kiln/io/safetensors.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

TEST(TensorParallelQwenImage, MatchesOneRank) {
  const std::string folder = testing::data_path("models/qwen-image-transformer-tiny");
  const io::SafetensorsFile g(testing::data_path("goldens/qwen_image_transformer/mask_3x5.safetensors"));
  const std::vector<models::QwenImageShape> shapes = {{1, 3, 5}};
  const nn::TensorParallel tp = dist::TensorParallelConfig{.mesh = dist::DeviceMesh("cpu", {2})}.layers();
  auto full = models::load_qwen_image_transformer(folder, float32);
  auto shard = models::load_qwen_image_transformer(folder, float32, tp);
  const auto run = [&](const models::QwenImageTransformer2DModel& m) {
    return m.forward(g.tensor("hidden_states"), g.tensor("encoder_hidden_states"),
                     g.tensor("encoder_hidden_states_mask"), g.tensor("timestep"), shapes);
  };
  const Tensor expected = run(*full);
  EXPECT_TRUE(testing::rel_max_error_within(run(*shard), expected, 1e-5)) << "eager";
  EXPECT_TRUE(testing::rel_max_error_within(expected, g.tensor("output"), 1e-4));
  shard->compile_repeated_blocks();
  EXPECT_TRUE(testing::rel_max_error_within(run(*shard), expected, 1e-5)) << "compiled blocks";
  size_t full_bytes = 0, shard_bytes = 0;
  for (const auto& [name, t] : full->named_parameters()) full_bytes += t->nbytes();
  for (const auto& [name, t] : shard->named_parameters()) shard_bytes += t->defined() ? t->nbytes() : 0;
  EXPECT_LT(shard_bytes, full_bytes * 6 / 10);
}

// The whole pipeline with its transformer (heads) and its Qwen2.5-VL text encoder split over two ranks: the
// one-rank image (within one 8-bit level), which is diffusers'; true CFG with texts of different lengths, so
// both calls of each step are split, one with a mask.
TEST(TensorParallelPipeline, QwenImageDrawsTheOneRankImage) {
  const testing::GoldenFile g("qwen_image", "list_cfg_64x64_s2");
  const std::string model = testing::data_path("models/qwen-image-tiny");
  auto one = QwenImagePipeline::from_pretrained(model);
  const PipelineOutput expected = one(g.request());
  const dist::TensorParallelConfig parallel{.mesh = dist::DeviceMesh("cpu", {2})};
  PipelineLoadOptions options;
  options.parallel_config = {{"transformer", parallel}, {"text_encoder", parallel}};
  auto split = QwenImagePipeline::from_pretrained(model, options);
  const PipelineOutput out = split(g.request());
  ASSERT_EQ(out.images.size(), expected.images.size());
  for (size_t i = 0; i < out.images.size(); ++i)
    EXPECT_LE(testing::max_level_difference(out.images[i], expected.images[i]), 1) << "image " << i;
  testing::expect_images_match(out, g);
}

}  // namespace
}  // namespace kiln
