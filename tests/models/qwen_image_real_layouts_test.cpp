// The real Qwen-Image transformer and text encoder (recorded on the meta device by
// tools/goldens/qwen_image_real_layouts.py from Qwen/Qwen-Image's configs): the models Kiln builds from the
// real config.json have diffusers' / the repo's tensor names and shapes and load strictly from them (the text
// encoder's vision tower and lm_head skipped). The VAE's: qwen_image_vae_test.cpp. Registering parameters
// allocates nothing and the layout source broadcasts one element, so 28 billion parameters cost no memory.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kiln/families/qwen_image/qwen_image_transformer.h"
#include "kiln/models/decoder_text_encoder.h"
#include "support/layout_source.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const nlohmann::json& layouts() {
  static const nlohmann::json j = [] {
    std::ifstream in(testing::data_path("goldens/qwen_image/real_layouts.json"));
    return nlohmann::json::parse(in);
  }();
  return j;
}

TEST(QwenImageRealLayouts, TheTransformerHasDiffusersNamesAndShapes) {
  const nlohmann::json& t = layouts()["transformer"];
  models::QwenImageTransformer2DModel transformer(
      models::QwenImageTransformerConfig::from_json(t["config"].dump(), "transformer/config.json"));
  std::map<std::string, Shape> mine, want;
  int64_t parameters = 0;
  for (const auto& [name, shape] : transformer.parameter_shapes()) {
    mine[name] = shape;
    parameters += shape_numel(shape);
  }
  for (auto& [name, shape] : t["tensors"].items()) want[name] = shape.get<Shape>();
  EXPECT_EQ(mine, want);
  EXPECT_EQ(parameters, 20430401088);
  nn::LoadOptions options;
  options.dtype = bfloat16;
  EXPECT_NO_THROW(transformer.load_weights(testing::LayoutSource(t["tensors"]), options));
}

TEST(QwenImageRealLayouts, TheTextEncodersLanguageModelLoadsStrictlyFromTheReposNames) {
  const nlohmann::json& te = layouts()["text_encoder"];
  const std::filesystem::path folder = testing::temp_dir("qwen_image_real_text_encoder");
  std::ofstream(folder / "config.json") << te["config"].dump();
  const auto config = models::DecoderTextEncoderConfig::from_file((folder / "config.json").string());
  EXPECT_EQ(config.family, models::DecoderFamily::Qwen2_5_VL);
  EXPECT_EQ(config.hidden_size, 3584);
  EXPECT_EQ(config.num_hidden_layers, 28);
  EXPECT_EQ(config.num_key_value_heads, 4);
  EXPECT_EQ(config.head_dim, 128);
  EXPECT_TRUE(config.qkv_bias);
  EXPECT_FALSE(config.attention_bias);
  EXPECT_DOUBLE_EQ(config.rope_theta, 1e6);
  // hidden_states[-1]: every layer and the final norm; model.* renamed, visual.* and lm_head.* skipped.
  std::unique_ptr<models::DecoderTextEncoder> model;
  ASSERT_NO_THROW(model = models::load_decoder_text_encoder(config, testing::LayoutSource(te["tensors"]),
                                                            bfloat16, {config.num_hidden_layers}));
  int64_t parameters = 0;
  for (const auto& [name, shape] : model->parameter_shapes()) parameters += shape_numel(shape);
  EXPECT_EQ(parameters, 7070619136);  // Qwen2.5-7B's 7.62B less its lm_head (152064 x 3584)
  // A language-model tensor missing from the file is named.
  nlohmann::json missing = te["tensors"];
  missing.erase("model.layers.27.self_attn.k_proj.bias");
  try {
    models::load_decoder_text_encoder(config, testing::LayoutSource(missing), bfloat16,
                                      {config.num_hidden_layers});
    ADD_FAILURE() << "a text encoder without a k_proj bias was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.27.self_attn.k_proj.bias"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
