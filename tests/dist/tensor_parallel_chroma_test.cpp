// Chroma with its transformer and its T5 split over two ranks: the one-rank image (within one 8-bit level),
// which is diffusers' (tests/pipelines/chroma_pipeline_test.cpp); with guidance, so both calls of each step
// are split.
#include <gtest/gtest.h>

#include "kiln/dist/device_mesh.h"
#include "kiln/families/chroma/chroma_pipeline.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

TEST(TensorParallelPipeline, ChromaDrawsTheOneRankImage) {
  const testing::GoldenFile g("chroma", "cfg_cat_64x64_s0");
  const std::string model = testing::data_path("models/chroma-tiny");
  auto one = ChromaPipeline::from_pretrained(model);
  const Image expected = one(g.request()).images.front();
  const dist::TensorParallelConfig parallel{.mesh = dist::DeviceMesh("cpu", {2})};
  PipelineLoadOptions options;
  options.parallel_config = {{"transformer", parallel}, {"text_encoder", parallel}};
  auto split = ChromaPipeline::from_pretrained(model, options);
  const Image image = split(g.request()).images.front();
  EXPECT_LE(testing::max_level_difference(image, expected), 1);
  EXPECT_GE(testing::share_within_one_level(image.pixels, g["image_u8"].select(0, 0)), 0.99);
}

}  // namespace
}  // namespace kiln
