// The text encoders and the VAE built from the REAL FLUX.1 configs must have exactly the tensor names and
// shapes of the real checkpoints (recorded by tools/goldens/flux.py in real_layouts.json from transformers'
// and diffusers' own classes), so a naming or shape mistake fails here instead of on a 30 GB download.
// Registering parameters allocates nothing, so full-size models cost no memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/t5_encoder.h"
#include "support/layout_source.h"
#include "support/test_data.h"

namespace kiln {
namespace {

nlohmann::json layouts() {
  std::ifstream in(testing::data_path("goldens/flux/real_layouts.json"));
  return nlohmann::json::parse(in);
}

// Writes the real config of `component` to a temp config.json and returns its path.
std::string config_file(const nlohmann::json& all, const std::string& component) {
  const std::string path = testing::temp_dir("real_config_" + component) + "/config.json";
  std::ofstream(path) << all["configs"][component].dump();
  return path;
}

// Same names both ways; the shapes are checked by loading (below), which compares each registered shape.
void expect_same_layout(nn::Module& model, const nlohmann::json& expected) {
  std::set<std::string> mine, want;
  for (const auto& entry : model.named_parameters()) mine.insert(entry.first);
  for (auto& [name, shape] : expected.items()) want.insert(name);
  std::vector<std::string> missing, extra;
  std::set_difference(want.begin(), want.end(), mine.begin(), mine.end(), std::back_inserter(missing));
  std::set_difference(mine.begin(), mine.end(), want.begin(), want.end(), std::back_inserter(extra));
  EXPECT_TRUE(missing.empty()) << missing.size() << " real tensors not in the model, e.g. "
                               << missing.front();
  EXPECT_TRUE(extra.empty()) << extra.size() << " model parameters not in the real checkpoint, e.g. "
                             << extra.front();
}

using testing::LayoutSource;

TEST(RealLayouts, ClipTextModelMatchesTheRealFluxTextEncoder) {
  const auto all = layouts();
  models::ClipTextModel model(models::ClipTextConfig::from_file(config_file(all, "text_encoder")));
  expect_same_layout(model, all["text_encoder"]);
  nn::LoadOptions options;
  options.dtype = bfloat16;
  EXPECT_NO_THROW(model.load_weights(LayoutSource(all["text_encoder"]), options));
  EXPECT_EQ(model.num_parameters(), 123060480);  // CLIP ViT-L/14 text tower
}

TEST(RealLayouts, T5EncoderMatchesTheRealFluxTextEncoder2) {
  const auto all = layouts();
  models::T5EncoderModel model(models::T5EncoderConfig::from_file(config_file(all, "text_encoder_2")));
  expect_same_layout(model, all["text_encoder_2"]);
  nn::LoadOptions options;
  options.dtype = bfloat16;
  EXPECT_NO_THROW(model.load_weights(LayoutSource(all["text_encoder_2"]), options));
  EXPECT_EQ(model.num_parameters(), 4762310656);  // T5 v1.1 XXL encoder
}

TEST(RealLayouts, AutoencoderKLMatchesTheRealFluxVae) {
  const auto all = layouts();
  models::AutoencoderKL model(models::AutoencoderKLConfig::from_file(config_file(all, "vae")));
  expect_same_layout(model, all["vae"]);
  nn::LoadOptions options;
  options.dtype = bfloat16;
  EXPECT_NO_THROW(model.load_weights(LayoutSource(all["vae"]), options));
  EXPECT_EQ(model.config().scale_factor(), 8);
}

}  // namespace
}  // namespace kiln
