// QwenImageEditPlusPipeline against diffusers 0.42.1 (tools/goldens/qwen_image_edit_plus.py, with
// Qwen2.5-VL's own 3-D positions for the images' tokens): each image's sizes at 384 x 384 and 1024 x 1024
// area, the instruction's tokens after "Picture N: " and each image's tokens, the text features read with
// both images, the images' latents beside the noise at their own grids, true CFG, and the images; bad calls
// refused before any work.
#include <gtest/gtest.h>

#include <sstream>

#include "kiln/families/qwen_image/qwen_image_edit_plus_pipeline.h"
#include "kiln/pipelines/image.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::GoldenFile;

QwenImageEditPlusPipeline load_edit_plus() {
  return QwenImageEditPlusPipeline::from_pretrained(testing::data_path("models/qwen-image-edit-plus-tiny"));
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

// The recorded call with its images (named in order in the metadata's "images").
PipelineRequest request_of(const GoldenFile& g) {
  PipelineRequest request = g.request();
  for (const std::string& name : split(g.meta("images")))
    request.image.push_back(Image::load(testing::data_path("goldens/flux2/" + name + ".png")));
  return request;
}

std::string size_of(const std::pair<int64_t, int64_t>& size) {
  return std::to_string(size.first) + "x" + std::to_string(size.second);
}

class QwenImageEditPlus : public ::testing::TestWithParam<const char*> {};

TEST_P(QwenImageEditPlus, EveryStageMatchesDiffusers) {
  const GoldenFile g("qwen_image_edit_plus", GetParam());
  QwenImageEditPlusPipeline pipe = load_edit_plus();
  const PipelineRequest request = request_of(g);
  ASSERT_EQ(request.image.size(), 2u);
  const std::vector<std::string> condition_sizes = split(g.meta("condition_sizes"));
  const std::vector<std::string> vae_sizes = split(g.meta("vae_sizes"));
  std::vector<Image> condition_images;
  int64_t image_tokens = 0;
  for (size_t k = 0; k < request.image.size(); ++k) {
    const Image& image = request.image[k];
    EXPECT_EQ(size_of(QwenImageEditPlusPipeline::image_size(QwenImageEditPlusPipeline::kConditionArea,
                                                            image.width, image.height)),
              condition_sizes[k]);
    const auto vae =
        QwenImageEditPlusPipeline::image_size(QwenImageEditPlusPipeline::kVaeArea, image.width, image.height);
    EXPECT_EQ(size_of(vae), vae_sizes[k]);
    image_tokens += (vae.first / 16) * (vae.second / 16);
    condition_images.push_back(
        QwenImageEditPlusPipeline::resized(image, QwenImageEditPlusPipeline::kConditionArea));
  }
  // The transformer read the noise's tokens and both images'.
  EXPECT_EQ((*request.height / 16) * (*request.width / 16) + image_tokens,
            std::stoll(g.meta("transformer_tokens")));

  // The instruction's tokens with both images', and the features read with them.
  EXPECT_EQ(QwenImageEditPlusPipeline::template_prompt(request.prompt, request.image.size()),
            g.meta("template_prompt"));
  const std::vector<int64_t> ids = pipe.tokenize(request.prompt, condition_images);
  EXPECT_TRUE(
      testing::all_close(Tensor::from_vector(ids, {1, static_cast<int64_t>(ids.size())}), g["ids_0"], 0, 0))
      << g.name;
  const auto [embeds, mask] =
      pipe.encode_prompt({request.prompt}, condition_images, 1, *request.max_sequence_length);
  EXPECT_TRUE(testing::rel_max_error_within(embeds, g["prompt_embeds"], 1e-4)) << g.name;
  EXPECT_EQ(mask.defined(), g.file.contains("prompt_embeds_mask")) << g.name;
  if (g.file.contains("negative_prompt_embeds")) {
    const auto [negative, negative_mask] =
        pipe.encode_prompt({*request.negative_prompt}, condition_images, 1, *request.max_sequence_length);
    EXPECT_TRUE(testing::rel_max_error_within(negative, g["negative_prompt_embeds"], 1e-4)) << g.name;
  }

  testing::expect_images_match(pipe(request), g);
}

INSTANTIATE_TEST_SUITE_P(Goldens, QwenImageEditPlus,
                         ::testing::Values("plus_2img_64x64_s0", "plus_2img_cfg_48x80_s1"));

TEST(QwenImageEditPlusPipeline, TheOutputTakesTheLastImagesRatio) {
  // ref_a (72 x 88) then ref_b (100 x 64): ref_b's ratio at 1024 x 1024 area.
  EXPECT_EQ(QwenImageEditPlusPipeline::image_size(QwenImageEditPlusPipeline::kVaeArea, 100, 64),
            std::make_pair(int64_t{1280}, int64_t{832}));
  // One "Picture N: " and image's tokens per image, before the instruction.
  EXPECT_NE(QwenImageEditPlusPipeline::template_prompt("x", 2).find(
                "<|im_start|>user\nPicture 1: <|vision_start|><|image_pad|><|vision_end|>Picture 2: "
                "<|vision_start|><|image_pad|><|vision_end|>x<|im_end|>"),
            std::string::npos);
}

// The field a refused call names.
std::string refused_field(QwenImageEditPlusPipeline& pipe, const PipelineRequest& request) {
  try {
    pipe(request);
  } catch (const RequestError& e) {
    return e.field();
  }
  return "(not refused)";
}

TEST(QwenImageEditPlusPipeline, CallsItCannotRunAreRefusedBeforeAnyWork) {
  const GoldenFile g("qwen_image_edit_plus", "plus_2img_64x64_s0");
  QwenImageEditPlusPipeline pipe = load_edit_plus();
  PipelineRequest none = request_of(g);
  none.image.clear();
  EXPECT_EQ(refused_field(pipe, none), "image");
  // diffusers takes one prompt a call.
  PipelineRequest two_prompts = request_of(g);
  two_prompts.prompts = {two_prompts.prompt, two_prompts.prompt};
  two_prompts.prompt.clear();
  EXPECT_EQ(refused_field(pipe, two_prompts), "prompts");
  // Every image within Qwen2.5-VL's ratio, not only the first.
  PipelineRequest thin = request_of(g);
  Image strip;
  strip.width = 1;
  strip.height = 300;
  strip.pixels.assign(300 * 3, 100);
  thin.image.push_back(strip);
  EXPECT_EQ(refused_field(pipe, thin), "image");
}

}  // namespace
}  // namespace kiln
