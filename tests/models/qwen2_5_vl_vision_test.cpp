// Qwen2.5-VL reading images, as Qwen-Image-Edit encodes its prompt, against transformers on the tiny model of
// tools/goldens/qwen2_5_vl_vision.py: the image processor (torchvision backend), the vision tower (windows
// and full attention), and the language model with the image embeddings at the image tokens, 3-D positions or
// not.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kiln/core/error.h"
#include "kiln/families/qwen_image/qwen2_vl_image_processor.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/qwen2_5_vl_vision.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/nn/renamed_weights.h"
#include "kiln/tokenizers/bpe_tokenizer.h"
#include "support/test_data.h"

namespace kiln {
namespace {

std::string model_path(const std::string& rest = "") {
  return testing::data_path("models/qwen2_5_vl-tiny" + (rest.empty() ? "" : "/" + rest));
}
io::SafetensorsFile golden(const std::string& name) {
  return io::SafetensorsFile(testing::data_path("goldens/qwen2_5_vl/" + name + ".safetensors"));
}
std::vector<models::ImageGrid> grids_of(const Tensor& thw) {
  std::vector<models::ImageGrid> grids;
  const auto v = thw.contiguous().to_vector<int64_t>();
  for (size_t i = 0; i + 2 < v.size(); i += 3) grids.push_back({v[i], v[i + 1], v[i + 2]});
  return grids;
}
models::Qwen2VLImageProcessorConfig processor_config() {
  return models::Qwen2VLImageProcessorConfig::from_folder(model_path("processor"));
}

TEST(Qwen2VLImageProcessor, PixelValuesEqualTransformersExactly) {
  auto refs = golden("processor");
  for (const std::string name : {"a", "big", "small"}) {
    const Image image = Image::load(model_path("images/" + name + ".png"));
    const auto input = models::qwen2_vl_preprocess(image, processor_config());
    const auto grid = grids_of(refs.tensor(name + "_grid"));
    ASSERT_EQ(grid.size(), 1u);
    EXPECT_EQ(input.grid.t, grid[0].t) << name;
    EXPECT_EQ(input.grid.h, grid[0].h) << name;
    EXPECT_EQ(input.grid.w, grid[0].w) << name;
    EXPECT_TRUE(testing::all_close(input.pixel_values, refs.tensor(name + "_pixel_values"), 0, 0)) << name;
  }
}

TEST(Qwen2VLImageProcessor, ConfigReadEitherLayout) {
  const auto c = processor_config();
  EXPECT_EQ(c.min_pixels, 256);
  EXPECT_EQ(c.max_pixels, 4096);
  EXPECT_EQ(c.patch_size, 4);
  // transformers 4's preprocessor_config.json: min_pixels / max_pixels at the top level.
  const std::string dir = ::testing::TempDir() + "/qwen_vl_processor";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/preprocessor_config.json")
      << R"({"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
            "merge_size": 2, "image_processor_type": "Qwen2VLImageProcessor"})";
  const auto v4 = models::Qwen2VLImageProcessorConfig::from_folder(dir);
  EXPECT_EQ(v4.min_pixels, 3136);
  EXPECT_EQ(v4.max_pixels, 12845056);
  EXPECT_EQ(v4.patch_size, 14);
  std::ofstream(dir + "/preprocessor_config.json") << R"({"resample": 2})";
  EXPECT_THROW(models::Qwen2VLImageProcessorConfig::from_folder(dir), Error);
}

using Size = std::pair<int64_t, int64_t>;

TEST(Qwen2VLImageProcessor, SizesAsSmartResize) {
  // Values worked through transformers' smart_resize (factor 28, Qwen-Image-Edit's limits).
  EXPECT_EQ(models::qwen2_vl_smart_resize(1024, 1024, 28, 3136, 12845056), Size(1036, 1036));
  EXPECT_EQ(models::qwen2_vl_smart_resize(10, 14, 8, 256, 4096), Size(16, 24));
  EXPECT_EQ(models::qwen2_vl_smart_resize(150, 200, 8, 256, 4096), Size(48, 72));
  // Ties round to even, as Python's round: 4 / 8 = 0.5 -> 0, then min_pixels takes over.
  EXPECT_EQ(models::qwen2_vl_smart_resize(4, 4, 8, 64, 4096), Size(8, 8));
  // Aspect ratio over 200: refused, as transformers refuses it.
  EXPECT_THROW(models::qwen2_vl_smart_resize(1, 201, 8, 256, 4096), Error);
  Image thin;
  thin.width = 402;
  thin.height = 2;
  thin.pixels.assign(402 * 2 * 3, 7);
  EXPECT_THROW(models::qwen2_vl_preprocess(thin, processor_config()), Error);
}

TEST(Qwen2VLImageProcessor, ExpandsImageTokensAsTheProcessor) {
  auto refs = golden("edit_plus");
  const auto grids = grids_of(refs.tensor("image_grid_thw"));
  const std::string text = refs.metadata().at("prompt");
  const std::string expanded = models::qwen2_vl_expand_image_tokens(text, grids, 2);
  const auto tok = tokenizers::BpeTokenizer::from_directory(model_path("processor"));
  const auto ids = tok.tokenize(expanded);
  EXPECT_EQ(ids, refs.tensor("input_ids").contiguous().to_vector<int64_t>());
  EXPECT_THROW(models::qwen2_vl_expand_image_tokens(text, {grids[0]}, 2), Error);
}

TEST(Qwen2_5_VLVision, ConfigReadAsTransformers) {
  const auto c = models::Qwen2_5_VLVisionConfig::from_file(model_path("text_encoder/config.json"));
  EXPECT_EQ(c.depth, 3);
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.head_dim(), 16);
  EXPECT_EQ(c.out_hidden_size, 48);
  EXPECT_EQ(c.patch_size, 4);
  EXPECT_EQ(c.window_size, 24);
  EXPECT_EQ(c.fullatt_block_indexes, std::vector<int64_t>{1});
  EXPECT_EQ(c.patch_values(), 96);
}

TEST(Qwen2_5_VLVision, ImageFeaturesMatchTransformersFloat32) {
  auto vision = models::load_qwen2_5_vl_vision(model_path("text_encoder"), float32);
  for (const std::string name : {"edit", "edit_plus"}) {
    auto refs = golden(name);
    const Tensor out = vision->forward(refs.tensor("pixel_values"), grids_of(refs.tensor("image_grid_thw")));
    EXPECT_TRUE(testing::rel_max_error_within(out, refs.tensor("image_embeds"), 1e-5)) << name;
  }
}

TEST(Qwen2_5_VLVision, ProcessorThenTowerMatchesTransformers) {
  auto vision = models::load_qwen2_5_vl_vision(model_path("text_encoder"), float32);
  auto refs = golden("edit");
  const auto input = models::qwen2_vl_preprocess(Image::load(model_path("images/a.png")), processor_config());
  EXPECT_TRUE(testing::rel_max_error_within(vision->forward(input.pixel_values, {input.grid}),
                                            refs.tensor("image_embeds"), 1e-5));
}

// The whole bfloat16 call (vision tower, then the language model on its bf16 embeddings) against
// transformers' own bfloat16 run, loaded as diffusers loads it (bf16 against float32 differs by 7% here:
// widened weights). Every op rounds to 8 significant bits and the two do not round at exactly the same
// places, so a few ulps accumulate: measured 0.9% for the tower, 1.6% for the language model given
// transformers' embeddings, 2.8% for the chain; bounded at 2%, 3% and 5%.
TEST(Qwen2_5_VLVision, Bfloat16MatchesTransformersBfloat16) {
  auto refs = golden("edit");
  const auto grids = grids_of(refs.tensor("image_grid_thw"));
  auto vision = models::load_qwen2_5_vl_vision(model_path("text_encoder"), bfloat16);
  const Tensor embeds = vision->forward(refs.tensor("pixel_values"), grids);
  EXPECT_EQ(embeds.dtype(), bfloat16);
  EXPECT_TRUE(testing::rel_max_error_within(embeds.to(float32), refs.tensor("bf16_image_embeds"), 2e-2));
  const auto config = models::DecoderTextEncoderConfig::from_file(model_path("text_encoder/config.json"));
  auto encoder = models::load_decoder_text_encoder(model_path("text_encoder"), bfloat16, {3});
  const auto images = models::multimodal_inputs(config, embeds, grids);
  const auto states =
      encoder->hidden_states(refs.tensor("input_ids"), refs.tensor("attention_mask"), {3}, &images);
  EXPECT_EQ(states[0].dtype(), bfloat16);
  EXPECT_TRUE(testing::rel_max_error_within(states[0].to(float32), refs.tensor("bf16_mrope_hidden_3"), 5e-2));
  // The language model alone, from transformers' own bf16 image embeddings.
  const auto same_inputs =
      models::multimodal_inputs(config, refs.tensor("bf16_image_embeds").to(bfloat16), grids);
  const auto exact =
      encoder->hidden_states(refs.tensor("input_ids"), refs.tensor("attention_mask"), {3}, &same_inputs);
  EXPECT_TRUE(testing::rel_max_error_within(exact[0].to(float32), refs.tensor("bf16_mrope_hidden_3"), 3e-2));
}

TEST(Qwen2_5_VLVision, StrictLoadingNamesTheTensor) {
  const models::Qwen2_5_VLVisionConfig config =
      models::Qwen2_5_VLVisionConfig::from_file(model_path("text_encoder/config.json"));
  nn::CheckpointWeights weights(model_path("text_encoder"));
  // The module tree's names (model.visual.*) load too.
  const nn::RenamedWeights module_tree(weights, [](const std::string& name) {
    return name.rfind("visual.", 0) == 0 ? "model." + name : name;
  });
  EXPECT_NO_THROW(models::load_qwen2_5_vl_vision(config, module_tree, float32));
  // A missing tensor.
  const nn::RenamedWeights missing(weights, [](const std::string& name) {
    return name == "visual.merger.ln_q.weight" ? "unused.ln_q.weight" : name;
  });
  try {
    models::load_qwen2_5_vl_vision(config, missing, float32);
    ADD_FAILURE() << "a missing tensor loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("merger.ln_q.weight"), std::string::npos) << e.what();
  }
  // A tensor of the wrong shape: a config whose blocks are wider than the checkpoint's.
  models::Qwen2_5_VLVisionConfig wider = config;
  wider.intermediate_size = 80;
  try {
    models::load_qwen2_5_vl_vision(wider, weights, float32);
    ADD_FAILURE() << "a wrong shape loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.0.mlp.gate_proj.weight"), std::string::npos) << e.what();
  }
}

TEST(Qwen2_5_VLVision, BadInputsAreClearErrors) {
  auto vision = models::load_qwen2_5_vl_vision(model_path("text_encoder"), float32);
  auto refs = golden("edit");
  const Tensor pixels = refs.tensor("pixel_values");
  EXPECT_THROW(vision->forward(pixels, {{1, 12, 14}}), Error);  // too few patches for the rows
  EXPECT_THROW(vision->forward(pixels, {{1, 13, 16}}), Error);  // not a multiple of the merge size
  EXPECT_THROW(vision->forward(pixels.narrow(1, 0, 90), {{1, 12, 16}}), Error);
  EXPECT_THROW(vision->forward(pixels, {}), Error);
}

class Qwen2_5_VLLanguageGoldens : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(Qwen2_5_VLLanguageGoldens, HiddenStatesMatchTransformersFloat32) {
  const auto [name, three_d] = GetParam();
  auto refs = golden(name);
  const auto config = models::DecoderTextEncoderConfig::from_file(model_path("text_encoder/config.json"));
  auto encoder = models::load_decoder_text_encoder(model_path("text_encoder"), float32, {0, 1, 3});
  const auto images = models::multimodal_inputs(config, refs.tensor("image_embeds"),
                                                grids_of(refs.tensor("image_grid_thw")), three_d);
  if (three_d) {
    const Tensor positions = models::DecoderTextEncoder::mrope_positions(
        refs.tensor("input_ids"), refs.tensor("attention_mask"), images);
    EXPECT_EQ(positions.to_vector<int64_t>(), refs.tensor("position_ids").contiguous().to_vector<int64_t>());
  }
  const auto states =
      encoder->hidden_states(refs.tensor("input_ids"), refs.tensor("attention_mask"), {0, 1, 3}, &images);
  const std::string p = three_d ? "mrope_hidden_" : "pipeline_hidden_";
  EXPECT_TRUE(testing::rel_max_error_within(states[0], refs.tensor(p + "0"), 1e-6));
  EXPECT_TRUE(testing::rel_max_error_within(states[1], refs.tensor(p + "1"), 1e-4));
  EXPECT_TRUE(testing::rel_max_error_within(states[2], refs.tensor(p + "3"), 1e-4));
}

INSTANTIATE_TEST_SUITE_P(QwenImageEdit, Qwen2_5_VLLanguageGoldens,
                         ::testing::Combine(::testing::Values("edit", "edit_plus"), ::testing::Bool()));

TEST(Qwen2_5_VLLanguage, VisionTowerThenLanguageModelMatchesTransformers) {
  auto refs = golden("edit_plus");
  const auto config = models::DecoderTextEncoderConfig::from_file(model_path("text_encoder/config.json"));
  EXPECT_EQ(config.mrope_section, (std::vector<int64_t>{2, 1, 3}));
  EXPECT_EQ(config.image_token_id, 910);
  auto vision = models::load_qwen2_5_vl_vision(model_path("text_encoder"), float32);
  auto encoder = models::load_decoder_text_encoder(model_path("text_encoder"), float32, {3});
  const auto grids = grids_of(refs.tensor("image_grid_thw"));
  const auto images =
      models::multimodal_inputs(config, vision->forward(refs.tensor("pixel_values"), grids), grids);
  const auto states =
      encoder->hidden_states(refs.tensor("input_ids"), refs.tensor("attention_mask"), {3}, &images);
  EXPECT_TRUE(testing::rel_max_error_within(states[0], refs.tensor("mrope_hidden_3"), 1e-4));
}

TEST(Qwen2_5_VLLanguage, MismatchedImagesAreClearErrors) {
  auto refs = golden("edit_plus");
  const auto config = models::DecoderTextEncoderConfig::from_file(model_path("text_encoder/config.json"));
  auto encoder = models::load_decoder_text_encoder(model_path("text_encoder"), float32, {1});
  const auto grids = grids_of(refs.tensor("image_grid_thw"));
  const Tensor embeds = refs.tensor("image_embeds");
  const Tensor ids = refs.tensor("input_ids"), mask = refs.tensor("attention_mask");
  // One image's embeddings short.
  auto short_embeds = models::multimodal_inputs(config, embeds.narrow(0, 0, 48), grids);
  EXPECT_THROW(encoder->hidden_states(ids, mask, {1}, &short_embeds), Error);
  // Grids that do not match the runs of image tokens.
  auto swapped = models::multimodal_inputs(config, embeds, {grids[1], grids[0]});
  EXPECT_THROW(encoder->hidden_states(ids, mask, {1}, &swapped), Error);
  // The wrong width.
  auto narrow = models::multimodal_inputs(config, embeds.narrow(1, 0, 40), grids);
  EXPECT_THROW(encoder->hidden_states(ids, mask, {1}, &narrow), Error);
}

// The multimodal path through compile() (one program for the whole call) and compile_repeated_blocks() (one
// per layer shape, the [B, 1, S, D] tables as inputs).
TEST(Qwen2_5_VLLanguage, CompiledPathsMatch) {
  auto refs = golden("edit");
  const auto config = models::DecoderTextEncoderConfig::from_file(model_path("text_encoder/config.json"));
  const auto images =
      models::multimodal_inputs(config, refs.tensor("image_embeds"), grids_of(refs.tensor("image_grid_thw")));
  const Tensor ids = refs.tensor("input_ids"), mask = refs.tensor("attention_mask");
  for (int mode = 0; mode < 2; ++mode) {
    auto encoder = models::load_decoder_text_encoder(model_path("text_encoder"), float32, {3});
    if (mode == 0) encoder->compile({.fullgraph = true, .dynamic = false});
    if (mode == 1) encoder->compile_repeated_blocks();
    for (int call = 0; call < 2; ++call) {
      const auto states = encoder->hidden_states(ids, mask, {3}, &images);
      EXPECT_TRUE(testing::rel_max_error_within(states[0], refs.tensor("mrope_hidden_3"), 1e-4))
          << "mode " << mode << " call " << call;
    }
  }
}

}  // namespace
}  // namespace kiln
