// QwenImageTransformer2DModel split over two ranks (diffusers' _tp_plan: each block's q/k/v and feed-forward
// inputs column-parallel, its output projections row-parallel; the modulations, embedders and proj_out
// column-parallel and gathered) gives the one-rank output with the text mask, eager and compiled, and each
// rank holds about half the weights.
#include <gtest/gtest.h>

#include "kiln/dist/device_mesh.h"
#include "kiln/families/qwen_image/qwen_image_transformer.h"
#include "kiln/io/safetensors.h"
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

}  // namespace
}  // namespace kiln
