// Qwen-Image's transformer from the single files people run it from (tools/goldens/qwen_image_files.py):
// ComfyUI's one .safetensors (diffusers' names; with ComfyUI's checkpoint prefix too) gives the folder's
// image, and city96-style GGUFs (arch "qwen_image", Q8_0 and Q4_0 weights that stay quantized, F32 norms,
// biases and embedders) give diffusers' from_single_file(..., GGUFQuantizationConfig) images within one 8-bit
// level. Files of other families, and a single file under tensor parallelism, are refused by name.
#include <gtest/gtest.h>

#include <cctype>

#include "families/family_helpers.h"
#include "families/qwen_image/qwen_image_single_file.h"
#include "kiln/families/qwen_image/qwen_image_pipeline.h"
#include "kiln/io/safetensors.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::expect_images_match;
using testing::GoldenFile;

std::string file(const std::string& name) {
  return testing::data_path("goldens/qwen_image_files/" + name);
}

std::unique_ptr<QwenImagePipeline> load(PipelineLoadOptions options) {
  return std::make_unique<QwenImagePipeline>(
      QwenImagePipeline::from_pretrained(testing::data_path("models/qwen-image-tiny"), options));
}

int quantized_weights(QwenImagePipeline& pipe) {
  int quantized = 0;
  for (const auto& [name, t] : pipe.transformer().named_parameters())
    quantized += t->defined() && t->dtype() == uint8;
  return quantized;
}

TEST(QwenImageFiles, TheSingleFileTransformerGivesTheFoldersImage) {
  const GoldenFile g("qwen_image", "cat_64x64_s0");
  const auto pipe = load({.transformer_file = file("transformer_single_file.safetensors")});
  expect_images_match((*pipe)(g.request()), g);
}

TEST(QwenImageFiles, ComfyUIsCheckpointPrefixIsTakenOff) {
  // ComfyUI's checkpoint saves name the transformer model.diffusion_model.*; read without a config (the
  // heads' width 32 then needs one: the folder's).
  const io::SafetensorsFile bare(file("transformer_single_file.safetensors"));
  std::vector<std::pair<std::string, Tensor>> prefixed;
  for (const std::string& name : bare.names())
    prefixed.emplace_back("model.diffusion_model." + name, bare.tensor(name));
  const std::string path = testing::temp_dir("qwen_image_files") + "/comfy_checkpoint.safetensors";
  io::save_safetensors(path, prefixed);
  const GoldenFile g("qwen_image", "cat_64x64_s0");
  const auto pipe = load({.transformer_file = path});
  expect_images_match((*pipe)(g.request()), g);
}

class QwenImageGguf : public ::testing::TestWithParam<const char*> {};

TEST_P(QwenImageGguf, GivesDiffusersImage) {
  const std::string type = GetParam();
  std::string lower = type;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const GoldenFile g("qwen_image_files", "gguf_" + lower + "_cat_64x64_s0");
  EXPECT_EQ(g.meta("transformer_file"), "transformer_single_file-" + type + ".gguf");
  const auto pipe = load({.transformer_file = file(g.meta("transformer_file"))});
  // Every block Linear (14 in each of 2 blocks), the time embedder's two, norm_out and proj_out stay
  // quantized; img_in and txt_in are F32 in the file, as city96's converter keeps them.
  EXPECT_EQ(quantized_weights(*pipe), 2 * 14 + 4);
  const PipelineOutput out = (*pipe)(g.request());
  expect_images_match(out, g);
  // The quantization shows: not the float32 transformer's image.
  const GoldenFile f32("qwen_image", "cat_64x64_s0");
  EXPECT_GT(testing::mean_level_difference(out.images[0].pixels, f32["image_u8"].select(0, 0)), 0.1);
}

INSTANTIATE_TEST_SUITE_P(Types, QwenImageGguf, ::testing::Values("Q8_0", "Q4_0"));

TEST(QwenImageFiles, FilesItCannotReadAreRefusedByName) {
  // Without a config: 32-wide heads, whose RoPE axes the file cannot tell.
  try {
    models::load_qwen_image_single_file(file("transformer_single_file.safetensors"), "", float32);
    ADD_FAILURE() << "a file with 32-wide heads was read without a config";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("give a config.json"), std::string::npos) << e.what();
  }
  // Other families' transformers: Z-Image's GGUF (named by its architecture) and Chroma's single file.
  const std::string config = testing::data_path("models/qwen-image-tiny/transformer");
  try {
    models::load_qwen_image_single_file(
        testing::data_path("goldens/z_image/transformer_single_file-Q8_0.gguf"), config, float32);
    ADD_FAILURE() << "a Z-Image GGUF was read as Qwen-Image";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a Qwen-Image transformer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'lumina2'"), std::string::npos) << e.what();
  }
  try {
    models::load_qwen_image_single_file(
        testing::data_path("goldens/chroma/transformer_single_file.safetensors"), config, float32);
    ADD_FAILURE() << "a Chroma file was read as Qwen-Image";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a Qwen-Image transformer"), std::string::npos) << e.what();
  }
  // Under tensor parallelism (the check QwenImagePipeline::load runs before it reads a single file; a whole
  // two-rank load would stop earlier here, at the one-process device mesh).
  try {
    single_file_transformer_config(
        testing::data_path("models/qwen-image-tiny"),
        {.transformer_file = file("transformer_single_file.safetensors"), .tensor_parallel = 2},
        "QwenImagePipeline");
    ADD_FAILURE() << "a single file was split across ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("QwenImagePipeline: a single-file transformer cannot be split"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(
      single_file_transformer_config(testing::data_path("models/qwen-image-tiny"), {}, "QwenImagePipeline"),
      testing::data_path("models/qwen-image-tiny/transformer/config.json"));
}

}  // namespace
}  // namespace kiln
