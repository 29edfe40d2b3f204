// The real Stable Diffusion 1.5 and SDXL base components (recorded on the meta device by
// tools/goldens/sd_real_layouts.py from their real configs): each model Kiln builds from the real config.json
// has exactly diffusers' / transformers' tensor names and shapes and loads strictly from them. Registering
// parameters allocates nothing and the layout source broadcasts one element, so 3.5 billion parameters cost
// no memory.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kiln/families/stable_diffusion/unet_2d_condition.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "support/layout_source.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const nlohmann::json& layouts() {
  static const nlohmann::json j = [] {
    std::ifstream in(testing::data_path("goldens/sd/real_layouts.json"));
    return nlohmann::json::parse(in);
  }();
  return j;
}

// The component's config written as its config.json, for the models that read one from a folder.
std::string config_folder(const std::string& model, const std::string& component) {
  const std::filesystem::path folder =
      std::filesystem::path(testing::temp_dir("sd_real_" + model)) / component;
  std::filesystem::create_directories(folder);
  std::ofstream(folder / "config.json") << layouts()[model][component]["config"].dump();
  return folder.string();
}

void expect_layout(nn::Module& model, const nlohmann::json& tensors, const std::string& what) {
  std::map<std::string, Shape> mine, want;
  for (const auto& [name, shape] : model.parameter_shapes()) mine[name] = shape;
  for (auto& [name, shape] : tensors.items()) want[name] = shape.get<Shape>();
  EXPECT_EQ(mine, want) << what;
  nn::LoadOptions options;
  options.dtype = bfloat16;
  EXPECT_NO_THROW(model.load_weights(testing::LayoutSource(tensors), options)) << what;
}

TEST(StableDiffusionRealLayouts, EveryComponentHasDiffusersNamesAndShapes) {
  for (const std::string model : {"sd15", "sdxl"}) {
    const nlohmann::json& m = layouts()[model];
    models::UNet2DConditionModel unet(
        models::UNet2DConditionConfig::from_json(m["unet"]["config"].dump(), model + " unet"));
    expect_layout(unet, m["unet"]["tensors"], model + " unet");
    models::AutoencoderKL vae(
        models::AutoencoderKLConfig::from_file(config_folder(model, "vae") + "/config.json"));
    expect_layout(vae, m["vae"]["tensors"], model + " vae");
    for (const std::string component : {"text_encoder", "text_encoder_2"}) {
      if (!m.contains(component)) continue;
      models::ClipTextModel clip(
          models::ClipTextConfig::from_file(config_folder(model, component) + "/config.json"));
      expect_layout(clip, m[component]["tensors"], model + " " + component);
    }
  }
}

}  // namespace
}  // namespace kiln
