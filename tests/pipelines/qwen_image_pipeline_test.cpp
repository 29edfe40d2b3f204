// QwenImagePipeline against diffusers 0.42.1, stage by stage and image by image, on the tiny pipeline of
// tools/goldens/qwen_image.py: the template and its tokens, Qwen2.5-VL's final hidden states less the
// template's first 34 (cut, zero-padded, masked), the dual-stream transformer's first call with and without
// a text mask, true CFG's norm rescale, the shifted schedule, the VAE's decode of the un-normalised latents,
// non-square sizes, prompt lists, several images per prompt, bfloat16.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "families/qwen_image/qwen_image_guidance.h"
#include "kiln/families/qwen_image/qwen_image_pipeline.h"
#include "kiln/families/qwen_image/qwen_image_transformer.h"
#include "kiln/ops.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::expect_images_match;
using testing::GoldenFile;

std::unique_ptr<QwenImagePipeline> load_qwen_image(const GoldenFile& g, PipelineLoadOptions options = {}) {
  options.dtype = g.meta("dtype") == "bfloat16" ? bfloat16 : float32;
  const std::string folder = testing::data_path("models/" + g.meta("model"));
  const std::string& cls = g.meta("pipeline");
  if (cls == "QwenImageImg2ImgPipeline")
    return std::make_unique<QwenImageImg2ImgPipeline>(
        QwenImageImg2ImgPipeline::from_pretrained(folder, options));
  if (cls == "QwenImageInpaintPipeline")
    return std::make_unique<QwenImageInpaintPipeline>(
        QwenImageInpaintPipeline::from_pretrained(folder, options));
  return std::make_unique<QwenImagePipeline>(QwenImagePipeline::from_pretrained(folder, options));
}

// The recorded per-prompt tensors `<prefix>_0`, `<prefix>_1`, ... .
std::vector<Tensor> numbered(const GoldenFile& g, const std::string& prefix) {
  std::vector<Tensor> out;
  for (int i = 0; g.file.contains(prefix + "_" + std::to_string(i)); ++i)
    out.push_back(g[prefix + "_" + std::to_string(i)]);
  return out;
}

std::vector<std::string> prompts_of(const PipelineRequest& request) {
  return request.prompts.empty() ? std::vector<std::string>{request.prompt} : request.prompts;
}

class QwenImageFloat32 : public ::testing::TestWithParam<const char*> {};

TEST_P(QwenImageFloat32, EveryStageMatchesDiffusers) {
  const GoldenFile g("qwen_image", GetParam());
  const auto pipe = load_qwen_image(g);
  const PipelineRequest request = g.request();
  const std::vector<std::string> prompts = prompts_of(request);
  const int n = request.num_images_per_prompt;
  const int64_t tokens = *request.max_sequence_length;

  // The template and each prompt's tokens.
  EXPECT_EQ(QwenImagePipeline::template_prompt(prompts[0]), g.meta("template_prompt")) << g.name;
  const std::vector<Tensor> ids = numbered(g, "ids");
  ASSERT_EQ(ids.size(), prompts.size()) << g.name;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int64_t> mine = pipe->tokenize(prompts[i]);
    EXPECT_TRUE(
        testing::all_close(Tensor::from_vector(mine, {1, static_cast<int64_t>(mine.size())}), ids[i], 0, 0))
        << g.name << " prompt " << i;
  }

  // The text features and their mask.
  const auto [embeds, mask] = pipe->encode_prompt(prompts, n, tokens);
  EXPECT_TRUE(testing::rel_max_error_within(embeds, g["prompt_embeds"], 1e-5)) << g.name;
  ASSERT_EQ(mask.defined(), g.file.contains("prompt_embeds_mask")) << g.name;
  if (mask.defined()) {
    EXPECT_TRUE(testing::all_close(mask, g["prompt_embeds_mask"], 0, 0)) << g.name;
  }

  // The transformer's first call on diffusers' inputs, and true CFG's prediction from its outputs.
  const models::QwenImageTransformer2DModel& transformer = pipe->transformer();
  const Tensor x = g["latents_init"], t = g["transformer_in_t"];
  const int64_t h = *request.height / 16, w = *request.width / 16;
  const std::vector<models::QwenImageShape> shapes = {{.frames = 1, .height = h, .width = w}};
  const Tensor mask_in = g.file.contains("prompt_embeds_mask") ? g["prompt_embeds_mask"] : Tensor();
  EXPECT_TRUE(testing::rel_max_error_within(transformer.forward(x, g["prompt_embeds"], mask_in, t, shapes),
                                            g["transformer_out_step0"], 1e-4))
      << g.name;
  if (g.file.contains("negative_transformer_out_step0")) {
    const Tensor cfg = qwen_image::norm_rescaled_cfg(
        g["transformer_out_step0"], g["negative_transformer_out_step0"], *request.true_cfg_scale);
    EXPECT_TRUE(testing::rel_max_error_within(cfg, g["noise_pred_step0"], 1e-5)) << g.name;
  }

  // The whole call.
  expect_images_match((*pipe)(request), g);
}

INSTANTIATE_TEST_SUITE_P(Goldens, QwenImageFloat32,
                         ::testing::Values("cat_64x64_s0", "cfg_48x80_s1", "list_cfg_64x64_s2"));

TEST(QwenImagePipeline, ThePromptChangesTheImage) {
  const GoldenFile cat("qwen_image", "cat_64x64_s0"), fox("qwen_image", "fox_64x64_s0");
  const auto pipe = load_qwen_image(fox);
  const PipelineOutput out = (*pipe)(fox.request());
  expect_images_match(out, fox);
  EXPECT_GT(testing::mean_level_difference(out.images[0].pixels, cat["image_u8"].select(0, 0)), 3.0);
}

TEST(QwenImagePipeline, Bfloat16StaysWithinItsNoise) {
  const GoldenFile g("qwen_image", "bf16_cfg_64x64_s1");
  const auto pipe = load_qwen_image(g);
  const PipelineOutput out = (*pipe)(g.request());
  const double mean = testing::mean_level_difference(out.images[0].pixels, g["image_u8"].select(0, 0));
  std::printf("[ levels   ] Qwen-Image bf16: mean %.3f vs diffusers\n", mean);
  EXPECT_LE(mean, 2.0);
}

TEST(QwenImagePipeline, ImageToImageMatchesDiffusers) {
  const GoldenFile g("qwen_image", "img2img_80x64_s4");
  expect_images_match((*load_qwen_image(g))(g.request()), g);
}

TEST(QwenImagePipeline, InpaintingMatchesDiffusers) {
  const GoldenFile g("qwen_image", "inpaint_80x64_s5");
  expect_images_match((*load_qwen_image(g))(g.request()), g);
}

// The editing classes run on the text-to-image class's components (kiln serve's way), nothing loaded again.
TEST(QwenImagePipeline, TheEditingClassesShareTheTextToImageComponents) {
  const GoldenFile t2i("qwen_image", "cat_64x64_s0"), i2i("qwen_image", "img2img_80x64_s4");
  const auto pipe = load_qwen_image(t2i);
  QwenImageImg2ImgPipeline edit = QwenImageImg2ImgPipeline::from_pipe(*pipe);
  EXPECT_EQ(&edit.transformer(), &pipe->transformer());
  expect_images_match(edit(i2i.request()), i2i);
}

TEST(QwenImagePipeline, RequestsItCannotRunAreRefusedBeforeAnyWork) {
  const GoldenFile g("qwen_image", "cat_64x64_s0");
  const auto pipe = load_qwen_image(g);
  PipelineRequest too_long = g.request();
  too_long.max_sequence_length = 1025;
  EXPECT_THROW((*pipe)(too_long), RequestError);
  PipelineRequest odd = g.request();
  odd.height = 72;  // not a multiple of 16
  EXPECT_THROW((*pipe)(odd), RequestError);
  PipelineRequest image = g.request();
  Image picture;
  picture.width = picture.height = 64;
  picture.pixels.assign(64 * 64 * 3, 128);
  image.image = {picture};  // text-to-image takes no image
  EXPECT_THROW((*pipe)(image), RequestError);
}

// Tensor parallelism splits the heads: a degree that does not divide them is refused by name, before any
// weight is read.
TEST(QwenImagePipeline, ATensorParallelDegreeThatDoesNotDivideTheHeadsIsRefused) {
  const auto config =
      models::QwenImageTransformerConfig::from_file(testing::data_path("models/qwen-image-tiny/transformer"));
  try {
    models::QwenImageTransformer2DModel model(config, {.rank = 0, .size = 3});
    ADD_FAILURE() << "3 ranks were taken for " << config.num_attention_heads << " heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads"), std::string::npos) << e.what();
  }
}

// A folder whose transformer config does not describe its weights fails while loading, naming the tensor.
TEST(QwenImagePipeline, AFolderWhoseConfigAndWeightsDisagreeIsRefused) {
  namespace fs = std::filesystem;
  const fs::path folder = fs::path(testing::temp_dir("qwen_image_disagree")) / "model";
  fs::remove_all(folder);
  fs::copy(testing::data_path("models/qwen-image-tiny"), folder, fs::copy_options::recursive);
  {
    std::ifstream in(folder / "transformer" / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config["joint_attention_dim"] = 64;
    std::ofstream(folder / "transformer" / "config.json") << config.dump();
  }
  try {
    QwenImagePipeline::from_pretrained(folder.string());
    ADD_FAILURE() << "a transformer whose config disagrees with its weights was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("txt_"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
