// ZImagePipeline, ZImageImg2ImgPipeline and ZImageInpaintPipeline against diffusers 0.42, stage by stage and
// image by image, on the tiny pipelines of tools/goldens/z_image.py (tools/goldens/z_image_notes.md says what
// each stage does): Qwen3's chat prompt and its second-to-last hidden states at each prompt's tokens, the
// single-stream transformer with its caption and image padding to 32 tokens, Turbo's unguided call,
// classifier-free guidance with prompts of different lengths, cfg_normalization and cfg_truncation, a size
// whose patches are not a multiple of 32, prompt lists, bfloat16, image-to-image and inpainting.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kiln/families/z_image/z_image_pipeline.h"
#include "kiln/families/z_image/z_image_transformer.h"
#include "kiln/ops.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::expect_images_match;
using testing::GoldenFile;

std::unique_ptr<ZImagePipeline> load_z_image(const GoldenFile& g, PipelineLoadOptions options = {}) {
  options.dtype = g.meta("dtype") == "bfloat16" ? bfloat16 : float32;
  const std::string folder = testing::data_path("models/" + g.meta("model"));
  const std::string& cls = g.meta("pipeline");
  if (cls == "ZImageImg2ImgPipeline")
    return std::make_unique<ZImageImg2ImgPipeline>(ZImageImg2ImgPipeline::from_pretrained(folder, options));
  if (cls == "ZImageInpaintPipeline")
    return std::make_unique<ZImageInpaintPipeline>(ZImageInpaintPipeline::from_pretrained(folder, options));
  return std::make_unique<ZImagePipeline>(ZImagePipeline::from_pretrained(folder, options));
}

// The recorded per-prompt tensors `<prefix>_0`, `<prefix>_1`, ... .
std::vector<Tensor> numbered(const GoldenFile& g, const std::string& prefix) {
  std::vector<Tensor> out;
  for (int i = 0; g.file.contains(prefix + "_" + std::to_string(i)); ++i)
    out.push_back(g[prefix + "_" + std::to_string(i)]);
  return out;
}

class ZImageFloat32 : public ::testing::TestWithParam<const char*> {};

TEST_P(ZImageFloat32, EveryStageMatchesDiffusers) {
  const GoldenFile g("z_image", GetParam());
  const auto pipe = load_z_image(g);
  const PipelineRequest request = g.request();
  const std::vector<std::string> prompts =
      request.prompts.empty() ? std::vector<std::string>{request.prompt} : request.prompts;
  const int64_t tokens = *request.max_sequence_length;

  // The chat prompt and its tokens.
  EXPECT_EQ(ZImagePipeline::chat_prompt(prompts[0]), g.meta("chat_prompt")) << g.name;
  const auto [ids, mask] = pipe->tokenize(prompts, tokens);
  EXPECT_TRUE(testing::all_close(ids, g["qwen_ids"], 0, 0)) << g.name;
  EXPECT_TRUE(testing::all_close(mask, g["qwen_mask"], 0, 0)) << g.name;

  // Each prompt's caption features: hidden_states[-2] at its own tokens.
  const std::vector<Tensor> embeds = pipe->encode_prompt(prompts, tokens);
  const std::vector<Tensor> expected = numbered(g, "prompt_embeds");
  ASSERT_EQ(embeds.size(), expected.size()) << g.name;
  for (size_t i = 0; i < embeds.size(); ++i)
    EXPECT_TRUE(testing::rel_max_error_within(embeds[i], expected[i], 1e-5)) << g.name << " prompt " << i;

  // The transformer's first call, on diffusers' inputs: the positive items, then (guided) the negative ones.
  std::vector<Tensor> captions;
  const int n = request.num_images_per_prompt;
  for (const Tensor& e : expected)
    for (int k = 0; k < n; ++k) captions.push_back(e);
  for (const Tensor& e : numbered(g, "negative_prompt_embeds"))
    for (int k = 0; k < n; ++k) captions.push_back(e);
  const Tensor x = g["transformer_in_x"].select(2, 0);
  const Tensor t = g["transformer_in_t"];
  const models::ZImageTransformer2DModel& transformer = pipe->transformer();
  EXPECT_TRUE(testing::rel_max_error_within(transformer.timestep_embedding(t).narrow(0, 0, 1),
                                            g["t_embed_step0"].narrow(0, 0, 1), 1e-5))
      << g.name;
  EXPECT_TRUE(testing::rel_max_error_within(transformer.forward(x, t, captions),
                                            g["transformer_out_step0"].select(2, 0), 1e-4))
      << g.name;

  // The whole call.
  expect_images_match((*pipe)(request), g);
}

INSTANTIATE_TEST_SUITE_P(Goldens, ZImageFloat32,
                         ::testing::Values("turbo_cat_64x64_s0", "cfg_cat_64x64_s1",
                                           "cfg_norm_trunc_48x80_s2", "list_64x64_s3"));

TEST(ZImagePipeline, ThePromptChangesTheImage) {
  const GoldenFile cat("z_image", "turbo_cat_64x64_s0"), fox("z_image", "turbo_fox_64x64_s0");
  const auto pipe = load_z_image(fox);
  const PipelineOutput out = (*pipe)(fox.request());
  expect_images_match(out, fox);
  EXPECT_GT(testing::mean_level_difference(out.images[0].pixels, cat["image_u8"].select(0, 0)), 5.0);
}

TEST(ZImagePipeline, Bfloat16StaysWithinItsNoise) {
  const GoldenFile g("z_image", "bf16_cat_64x64_s0");
  const auto pipe = load_z_image(g);
  const PipelineOutput out = (*pipe)(g.request());
  const double mean = testing::mean_level_difference(out.images[0].pixels, g["image_u8"].select(0, 0));
  std::printf("[ levels   ] Z-Image bf16: mean %.3f vs diffusers\n", mean);
  EXPECT_LE(mean, 2.0);  // 1.3 on an AMX Xeon; diffusers' own bf16 image is 1.7 levels from its f32 one
}

TEST(ZImagePipeline, ImageToImageMatchesDiffusers) {
  const GoldenFile g("z_image", "img2img_80x64_s4");
  const auto pipe = load_z_image(g);
  PipelineRequest request = g.request();
  // Without a size, the image's own (as diffusers).
  request.height.reset();
  request.width.reset();
  expect_images_match((*pipe)(request), g);
}

TEST(ZImagePipeline, InpaintingMatchesDiffusers) {
  const GoldenFile g("z_image", "inpaint_80x64_s5");
  const auto pipe = load_z_image(g);
  expect_images_match((*pipe)(g.request()), g);
}

// The transformer as ComfyUI ships it (tools/goldens/z_image_files.py: the original names, fused qkv) gives
// the folder's image; a GGUF of it (Linear weights in Q8_0, as the community quantizes it) keeps its weights
// quantized and gives diffusers' image from the same file (from_single_file with GGUFQuantizationConfig).
TEST(ZImagePipeline, TheSingleFileTransformerGivesTheFoldersImage) {
  const GoldenFile g("z_image", "turbo_cat_64x64_s0");
  const auto pipe = load_z_image(
      g, {.transformer_file = testing::data_path("goldens/z_image/transformer_single_file.safetensors")});
  expect_images_match((*pipe)(g.request()), g);
}

TEST(ZImagePipeline, AGgufQ8_0TransformerGivesDiffusersImage) {
  const GoldenFile g("z_image", "gguf_q8_0_turbo_cat_64x64_s0");
  const auto pipe = load_z_image(
      g, {.transformer_file = testing::data_path("goldens/z_image/transformer_single_file-Q8_0.gguf")});
  int quantized = 0;
  for (const auto& [name, t] : pipe->transformer().named_parameters())
    quantized += t->defined() && t->dtype() == uint8;
  EXPECT_EQ(quantized, 24 + 4 * (3 - 1));  // the file's 24, each block's fused qkv split in 3
  const PipelineOutput out = (*pipe)(g.request());
  expect_images_match(out, g);
  const GoldenFile f32("z_image", "turbo_cat_64x64_s0");
  EXPECT_GT(testing::mean_level_difference(out.images[0].pixels, f32["image_u8"].select(0, 0)), 0.5);
}

TEST(ZImageTransformer, SingleFilesItCannotReadAreRefusedByName) {
  // Without a config: 32-wide heads, whose RoPE axes the file cannot tell.
  try {
    models::ZImageTransformer2DModel::from_single_file(
        testing::data_path("goldens/z_image/transformer_single_file.safetensors"), {.dtype = float32});
    ADD_FAILURE() << "a file with 32-wide heads was read without a config";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("give a config.json"), std::string::npos) << e.what();
  }
  // Another family's transformer.
  try {
    models::ZImageTransformer2DModel::from_single_file(
        testing::data_path("goldens/chroma/transformer_single_file.safetensors"),
        {.config = testing::data_path("models/z-image-tiny/transformer"), .dtype = float32});
    ADD_FAILURE() << "a Chroma file was read as Z-Image";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a Z-Image transformer"), std::string::npos) << e.what();
  }
}

// diffusers' Z-Image pipelines Kiln does not run are refused naming the class, before anything loads.
TEST(ZImagePipeline, ControlNetAndOmniFoldersAreRefusedByName) {
  namespace fs = std::filesystem;
  for (const std::string cls : {"ZImageControlNetPipeline", "ZImageOmniPipeline"}) {
    const fs::path folder = fs::path(testing::temp_dir("z_image_" + cls)) / "model";
    fs::remove_all(folder);
    fs::copy(testing::data_path("models/z-image-tiny"), folder, fs::copy_options::recursive);
    {
      std::ifstream in(folder / "model_index.json");
      nlohmann::json index = nlohmann::json::parse(in);
      index["_class_name"] = cls;
      std::ofstream(folder / "model_index.json") << index.dump();
    }
    try {
      DiffusionPipeline::from_pretrained(folder.string());
      ADD_FAILURE() << cls << " was loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cls), std::string::npos) << e.what();
    }
  }
}

// A folder whose transformer config does not describe its weights fails while loading, naming the tensor and
// both shapes.
TEST(ZImagePipeline, AFolderWhoseConfigAndWeightsDisagreeIsRefused) {
  namespace fs = std::filesystem;
  const fs::path folder = fs::path(testing::temp_dir("z_image_disagree")) / "model";
  fs::remove_all(folder);
  fs::copy(testing::data_path("models/z-image-tiny"), folder, fs::copy_options::recursive);
  {
    std::ifstream in(folder / "transformer" / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config["cap_feat_dim"] = 64;  // the weights were made for Qwen3's 48
    std::ofstream(folder / "transformer" / "config.json") << config.dump();
  }
  try {
    ZImagePipeline::from_pretrained(folder.string());
    ADD_FAILURE() << "a transformer config that does not fit its weights was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cap_embedder"), std::string::npos) << e.what();
  }
}

TEST(ZImagePipeline, RefusesWhatItDoesNotTake) {
  PipelineRequest r = testing::small_request();
  r.prompt_2 = "second";
  testing::expect_refused("ZImagePipeline", r, "prompt_2", "ZImagePipeline takes no prompt_2");
  r = testing::small_request();
  r.true_cfg_scale = 4.0f;
  testing::expect_refused("ZImagePipeline", r, "true_cfg_scale", "ZImagePipeline takes no true_cfg_scale");
  r = testing::small_request();
  r.cfg_truncation = 1.5f;
  testing::expect_refused("ZImagePipeline", r, "cfg_truncation", "");
}

TEST(ZImagePipeline, RefusesASizeThatIsNotAMultipleOf16) {
  auto pipe = ZImagePipeline::from_pretrained(testing::data_path("models/z-image-tiny"));
  PipelineRequest r = testing::small_request();
  r.height = 40;
  try {
    pipe(r);
    ADD_FAILURE() << "a height of 40 was taken";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "height");
    EXPECT_NE(std::string(e.what()).find("16"), std::string::npos) << e.what();
  }
}

// Tensor parallelism splits the heads: a degree that does not divide them is refused by name, before loading.
TEST(ZImageTransformer, RefusesATensorParallelDegreeThatDoesNotDivideTheHeads) {
  const auto config =
      models::ZImageTransformerConfig::from_file(testing::data_path("models/z-image-tiny/transformer"));
  try {
    models::ZImageTransformer2DModel model(config, {.rank = 0, .size = 3});
    ADD_FAILURE() << "3 ranks were taken for " << config.n_heads << " heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_heads"), std::string::npos) << e.what();
  }
}

// Bad configs are refused naming what is wrong.
TEST(ZImageTransformer, RefusesConfigsItCannotRun) {
  const auto refused = [](const std::string& json, const std::string& words) {
    try {
      models::ZImageTransformerConfig::from_json(json);
      ADD_FAILURE() << json << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(R"({"_class_name": "FluxTransformer2DModel"})", "not a Z-Image transformer config");
  refused(R"({"_class_name": "ZImageTransformer2DModel", "siglip_feat_dim": 1152})", "Z-Image Omni");
  refused(R"({"_class_name": "ZImageTransformer2DModel", "dim": 64, "n_heads": 2, "n_kv_heads": 2,
              "axes_dims": [8, 8, 8]})",
          "axes_dims sum to 24");
  refused(R"({"_class_name": "ZImageTransformer2DModel", "n_kv_heads": 10})", "n_kv_heads");
  refused(R"({"_class_name": "ZImageTransformer2DModel", "n_refiner_layer": 2})",
          "not a ZImageTransformer2DModel argument");
}

}  // namespace
}  // namespace kiln
