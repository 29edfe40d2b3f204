// QwenImageEditPipeline against diffusers 0.42.1 (tools/goldens/qwen_image_edit.py, with Qwen2.5-VL's own 3-D
// positions for the image's tokens): the image's size at 1024 x 1024 area, the instruction's tokens with the
// image's expanded, the text features read with the image, the image's latents beside the noise, true CFG,
// and the images; bad calls refused before any work.
#include <gtest/gtest.h>

#include "kiln/families/qwen_image/qwen_image_edit_pipeline.h"
#include "kiln/pipelines/image.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::GoldenFile;

QwenImageEditPipeline load_edit() {
  return QwenImageEditPipeline::from_pretrained(testing::data_path("models/qwen-image-edit-tiny"));
}

class QwenImageEdit : public ::testing::TestWithParam<const char*> {};

TEST_P(QwenImageEdit, EveryStageMatchesDiffusers) {
  const GoldenFile g("qwen_image_edit", GetParam());
  QwenImageEditPipeline pipe = load_edit();
  const PipelineRequest request = g.request();
  ASSERT_EQ(request.image.size(), 1u);
  const Image& image = request.image.front();
  const auto [width, height] = QwenImageEditPipeline::image_size(image.width, image.height);
  EXPECT_EQ(width, std::stoll(g.meta("calculated_width")));
  EXPECT_EQ(height, std::stoll(g.meta("calculated_height")));

  // The instruction's tokens with the image's, and the features read with the image.
  const Image resized = QwenImageEditPipeline::resized(image);
  const std::vector<int64_t> ids = pipe.tokenize(request.prompt, resized);
  EXPECT_TRUE(
      testing::all_close(Tensor::from_vector(ids, {1, static_cast<int64_t>(ids.size())}), g["ids_0"], 0, 0))
      << g.name;
  const auto [embeds, mask] = pipe.encode_prompt({request.prompt}, resized, 1, *request.max_sequence_length);
  EXPECT_TRUE(testing::rel_max_error_within(embeds, g["prompt_embeds"], 1e-4)) << g.name;
  EXPECT_EQ(mask.defined(), g.file.contains("prompt_embeds_mask")) << g.name;

  testing::expect_images_match(pipe(request), g);
}

INSTANTIATE_TEST_SUITE_P(Goldens, QwenImageEdit, ::testing::Values("edit_64x64_s0", "edit_cfg_48x80_s1"));

TEST(QwenImageEditPipeline, CallsItCannotRunAreRefusedBeforeAnyWork) {
  const GoldenFile g("qwen_image_edit", "edit_64x64_s0");
  QwenImageEditPipeline pipe = load_edit();
  PipelineRequest none = g.request();
  none.image.clear();
  EXPECT_THROW(pipe(none), RequestError);
  PipelineRequest two = g.request();
  two.image.push_back(two.image.front());
  EXPECT_THROW(pipe(two), RequestError);
  PipelineRequest thin = g.request();
  Image strip;
  strip.width = 1;
  strip.height = 300;
  strip.pixels.assign(300 * 3, 100);
  thin.image = {strip};
  EXPECT_THROW(pipe(thin), RequestError);
}

}  // namespace
}  // namespace kiln
