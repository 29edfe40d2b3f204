// Z-Image with its transformer (heads) and its Qwen3 text encoder split over two ranks: the one-rank image
// (within one 8-bit level), which is diffusers' (tests/pipelines/z_image_pipeline_test.cpp); guided, with a
// prompt and a negative prompt padded to different lengths, so both batches of each step are split. (A degree
// that does not divide the heads: tests/pipelines/z_image_pipeline_test.cpp.)
#include <gtest/gtest.h>

#include "kiln/dist/device_mesh.h"
#include "kiln/families/z_image/z_image_pipeline.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

TEST(TensorParallelPipeline, ZImageDrawsTheOneRankImage) {
  const testing::GoldenFile g("z_image", "cfg_cat_64x64_s1");
  const std::string model = testing::data_path("models/z-image-tiny");
  auto one = ZImagePipeline::from_pretrained(model);
  const Image expected = one(g.request()).images.front();
  const dist::TensorParallelConfig parallel{.mesh = dist::DeviceMesh("cpu", {2})};
  PipelineLoadOptions options;
  options.parallel_config = {{"transformer", parallel}, {"text_encoder", parallel}};
  auto split = ZImagePipeline::from_pretrained(model, options);
  const Image image = split(g.request()).images.front();
  EXPECT_LE(testing::max_level_difference(image, expected), 1);
  EXPECT_GE(testing::share_within_one_level(image.pixels, g["image_u8"].select(0, 0)), 0.99);
}

}  // namespace
}  // namespace kiln
