// The text encoders and the VAE built from the REAL Stable Diffusion 3.5 configs must have exactly the tensor
// names and shapes of the real checkpoints (recorded by tools/goldens/sd3.py in real_layouts.json from
// transformers' and diffusers' own classes). Registering parameters allocates nothing, so full-size models
// cost no memory. (The transformers are checked in sd3_transformer_test.cpp.)
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/sd3_transformer.h"
#include "kiln/models/t5_encoder.h"
#include "support/test_data.h"

namespace kiln {
namespace {

nlohmann::json sd3_layouts() {
  std::ifstream in(testing::data_path("goldens/sd3/real_layouts.json"));
  return nlohmann::json::parse(in);
}

// Writes the real config of `component` to a temp config.json and returns its path.
std::string sd3_config_file(const nlohmann::json& all, const std::string& component) {
  const std::string path = testing::temp_dir("sd3_real_config_" + component) + "/config.json";
  std::ofstream(path) << all["configs"][component].dump();
  return path;
}

// The same names both ways, each with the same shape.
void expect_same_layout(nn::Module& model, const nlohmann::json& expected, const std::string& what) {
  std::map<std::string, Shape> mine, want;
  for (const auto& [name, shape] : model.parameter_shapes()) mine[name] = shape;
  for (const auto& [name, shape] : expected.items()) want[name] = shape.get<Shape>();
  std::vector<std::string> missing, extra, wrong;
  for (const auto& [name, shape] : want) {
    if (!mine.count(name))
      missing.push_back(name);
    else if (mine[name] != shape)
      wrong.push_back(name);
  }
  for (const auto& [name, shape] : mine)
    if (!want.count(name)) extra.push_back(name);
  EXPECT_TRUE(missing.empty()) << what << ": " << missing.size() << " real tensors not in the model, e.g. "
                               << missing.front();
  EXPECT_TRUE(extra.empty()) << what << ": " << extra.size()
                             << " parameters not in the real checkpoint, e.g. " << extra.front();
  EXPECT_TRUE(wrong.empty()) << what << ": " << wrong.size() << " with another shape, e.g. " << wrong.front();
}

TEST(SD3RealLayouts, ClipEncodersWithProjection) {
  const auto all = sd3_layouts();
  int64_t pooled = 0;
  for (const char* key : {"text_encoder", "text_encoder_2"}) {
    const auto config = models::ClipTextConfig::from_file(sd3_config_file(all, key));
    EXPECT_TRUE(config.with_projection) << key;
    pooled += config.projection_dim;
    models::ClipTextModel model(config);
    expect_same_layout(model, all[key], key);
  }
  // The pooled vectors [CLIP-L | CLIP-G] are what the transformers' pooled_projection_dim expects.
  for (const char* t : {"transformer_medium", "transformer_large"})
    EXPECT_EQ(models::SD3TransformerConfig::from_json(all["configs"][t].dump()).pooled_projection_dim,
              pooled);
  EXPECT_EQ(models::ClipTextConfig::from_file(sd3_config_file(all, "text_encoder_2")).hidden_act, "gelu");
}

TEST(SD3RealLayouts, T5Encoder) {
  const auto all = sd3_layouts();
  const auto config = models::T5EncoderConfig::from_file(sd3_config_file(all, "text_encoder_3"));
  models::T5EncoderModel model(config);
  expect_same_layout(model, all["text_encoder_3"], "text_encoder_3");
  EXPECT_EQ(models::SD3TransformerConfig::from_json(all["configs"]["transformer_medium"].dump())
                .joint_attention_dim,
            config.d_model);
}

TEST(SD3RealLayouts, Vae) {
  const auto all = sd3_layouts();
  const auto config = models::AutoencoderKLConfig::from_file(sd3_config_file(all, "vae"));
  EXPECT_EQ(config.latent_channels, 16);
  EXPECT_DOUBLE_EQ(config.scaling_factor, 1.5305);
  EXPECT_DOUBLE_EQ(config.shift_factor, 0.0609);
  EXPECT_FALSE(config.use_quant_conv);
  EXPECT_FALSE(config.use_post_quant_conv);
  models::AutoencoderKL model(config);
  expect_same_layout(model, all["vae"], "vae");
}

}  // namespace
}  // namespace kiln
