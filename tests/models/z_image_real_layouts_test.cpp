// Z-Image-Turbo's real checkpoints (recorded on the meta device by tools/goldens/z_image_files.py): the
// transformer built from the real config has exactly diffusers' tensor names and shapes and loads strictly
// from them, and from ComfyUI's single-file layout of them (fused qkv, original names) with the config read
// off the file's shapes; the Qwen3-4B text encoder loads the layers the pipeline reads (hidden_states[-2])
// from Qwen3Model's names. Registering parameters allocates nothing and the layout source broadcasts one
// element, so 10 billion parameters cost no memory.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "families/z_image/z_image_single_file.h"
#include "kiln/families/z_image/z_image_transformer.h"
#include "kiln/models/decoder_text_encoder.h"
#include "support/layout_source.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const nlohmann::json& layouts() {
  static const nlohmann::json j = [] {
    std::ifstream in(testing::data_path("goldens/z_image/real_layouts.json"));
    return nlohmann::json::parse(in);
  }();
  return j;
}

TEST(ZImageRealLayouts, TheTransformerHasDiffusersNamesAndShapes) {
  const auto config = models::ZImageTransformerConfig::from_json(layouts()["transformer_config"].dump());
  models::ZImageTransformer2DModel model(config);
  std::map<std::string, Shape> mine;
  for (const auto& [name, shape] : model.parameter_shapes()) mine[name] = shape;
  std::map<std::string, Shape> want;
  for (auto& [name, shape] : layouts()["transformer"].items()) want[name] = shape.get<Shape>();
  EXPECT_EQ(mine, want);
  nn::LoadOptions options;
  options.dtype = bfloat16;
  EXPECT_NO_THROW(model.load_weights(testing::LayoutSource(layouts()["transformer"]), options));
}

TEST(ZImageRealLayouts, ComfyUIsSingleFileLoadsWithTheConfigReadOffIt) {
  auto file = std::make_shared<testing::LayoutSource>(layouts()["transformer_single_file"]);
  ASSERT_TRUE(models::is_z_image_single_file(*file));
  const models::ZImageTransformerConfig inferred = models::infer_z_image_config(*file);
  const auto real = models::ZImageTransformerConfig::from_json(layouts()["transformer_config"].dump());
  EXPECT_EQ(inferred.dim, real.dim);
  EXPECT_EQ(inferred.n_heads, real.n_heads);
  EXPECT_EQ(inferred.n_layers, real.n_layers);
  EXPECT_EQ(inferred.n_refiner_layers, real.n_refiner_layers);
  EXPECT_EQ(inferred.cap_feat_dim, real.cap_feat_dim);
  EXPECT_EQ(inferred.in_channels, real.in_channels);
  EXPECT_EQ(inferred.axes_dims, real.axes_dims);
  EXPECT_EQ(inferred.axes_lens, real.axes_lens);
  models::ZImageTransformer2DModel model(inferred);
  nn::LoadOptions options;
  options.dtype = bfloat16;
  EXPECT_NO_THROW(model.load_weights(*models::z_image_single_file_weights(file, inferred), options));
}

TEST(ZImageRealLayouts, TheTextEncoderLoadsTheLayersThePipelineReads) {
  const std::string path = testing::temp_dir("z_image_real_text_encoder") + "/config.json";
  std::ofstream(path) << layouts()["text_encoder_config"].dump();
  const auto config = models::DecoderTextEncoderConfig::from_file(path);
  EXPECT_EQ(config.family, models::DecoderFamily::Qwen3);
  EXPECT_EQ(config.hidden_size, layouts()["transformer_config"]["cap_feat_dim"].get<int64_t>());
  // hidden_states[-2]: 35 of the 36 layers, no final norm; the rest of the checkpoint is ignored by name.
  const auto encoder = models::load_decoder_text_encoder(
      config, testing::LayoutSource(layouts()["text_encoder"]), bfloat16, {config.num_hidden_layers - 1});
  EXPECT_EQ(encoder->num_layers_built(), config.num_hidden_layers - 1);
}

}  // namespace
}  // namespace kiln
