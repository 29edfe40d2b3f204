// The real single files finetunes ship as (v1-5-pruned.safetensors, v2-1_768-ema-pruned.safetensors,
// sd_xl_base_1.0.safetensors, sd_xl_refiner_1.0.safetensors), at full size: their names and shapes in
// Stability's original layout, recorded on the meta device by tools/goldens/sd_real_single_file_layouts.py
// and checked there against diffusers' own single-file conversion. Kiln tells each file's kind as diffusers
// does, reads the UNet's shapes off it, and every component it takes from the file loads strictly into the
// model built from the real config. Each tensor is one element broadcast to its shape, so 3.5 billion
// parameters cost no memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "families/stable_diffusion/sd_single_file.h"
#include "kiln/families/stable_diffusion/unet_2d_condition.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "support/layout_source.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using Kind = models::StableDiffusionSingleFile::Kind;

const nlohmann::json& layouts() {
  static const nlohmann::json j = [] {
    std::ifstream in(testing::data_path("goldens/sd_single_file/real_layouts.json"));
    return nlohmann::json::parse(in);
  }();
  return j;
}

// `config` written as a config.json, for the models that read theirs from a file.
std::string config_file(const std::string& model, const std::string& component,
                        const nlohmann::json& config) {
  const std::filesystem::path folder = std::filesystem::path(testing::temp_dir("sd_real_file_" + model));
  std::filesystem::create_directories(folder);
  const std::filesystem::path path = folder / (component + ".json");
  std::ofstream(path) << config.dump();
  return path.string();
}

void expect_loads(nn::Module& model, const nn::WeightSource* source, const std::string& what) {
  ASSERT_NE(source, nullptr) << what << " is not in the file";
  // Every parameter the model has, and nothing else, is in the component's view.
  std::vector<std::string> mine, theirs = source->names();
  for (const auto& [name, shape] : model.parameter_shapes()) mine.push_back(name);
  std::sort(mine.begin(), mine.end());
  std::sort(theirs.begin(), theirs.end());
  EXPECT_EQ(mine, theirs) << what;
  nn::LoadOptions options;
  options.dtype = bfloat16;
  EXPECT_NO_THROW(model.load_weights(*source, options)) << what;
}

struct Case {
  const char* model;
  Kind kind;
  int64_t cross_attention_dim;
  std::vector<int64_t> block_out_channels;
};

TEST(StableDiffusionRealSingleFiles, EveryComponentLoadsStrictlyFromTheFile) {
  for (const Case& c : {Case{"sd15", Kind::SD1, 768, {320, 640, 1280, 1280}},
                        Case{"sd21", Kind::SD2, 1024, {320, 640, 1280, 1280}},
                        Case{"sdxl", Kind::SDXL, 2048, {320, 640, 1280}},
                        Case{"refiner", Kind::SDXLRefiner, 1280, {384, 768, 1536, 1536}}}) {
    SCOPED_TRACE(c.model);
    const nlohmann::json& m = layouts()[c.model];
    const models::StableDiffusionSingleFile file =
        models::read_stable_diffusion_single_file(std::make_shared<testing::LayoutSource>(m["tensors"]));
    EXPECT_EQ(file.kind, c.kind);
    EXPECT_EQ(file.in_channels, 4);
    EXPECT_EQ(file.cross_attention_dim, c.cross_attention_dim);
    EXPECT_EQ(file.layers_per_block, 2);
    EXPECT_EQ(file.block_out_channels, c.block_out_channels);

    const nlohmann::json& configs = m["configs"];
    models::UNet2DConditionModel unet(
        models::UNet2DConditionConfig::from_json(configs["unet"].dump(), std::string(c.model) + " unet"));
    expect_loads(unet, file.unet.get(), "unet");
    models::AutoencoderKL vae(
        models::AutoencoderKLConfig::from_file(config_file(c.model, "vae", configs["vae"])));
    expect_loads(vae, file.vae.get(), "vae");
    for (const std::string component : {"text_encoder", "text_encoder_2"}) {
      const nn::WeightSource* source =
          component == "text_encoder" ? file.text_encoder.get() : file.text_encoder_2.get();
      if (!configs.contains(component)) {
        EXPECT_EQ(source, nullptr) << component << " read from a file without it";
        continue;
      }
      models::ClipTextModel clip(
          models::ClipTextConfig::from_file(config_file(c.model, component, configs[component])));
      expect_loads(clip, source, component);
    }
  }
}

// A tensor the file should have, missing, is named (the strict load reads every one).
TEST(StableDiffusionRealSingleFiles, AMissingTensorIsNamed) {
  nlohmann::json tensors = layouts()["sdxl"]["tensors"];
  tensors.erase("model.diffusion_model.output_blocks.2.2.conv.weight");
  const models::StableDiffusionSingleFile file =
      models::read_stable_diffusion_single_file(std::make_shared<testing::LayoutSource>(tensors));
  models::UNet2DConditionModel unet(
      models::UNet2DConditionConfig::from_json(layouts()["sdxl"]["configs"]["unet"].dump(), "sdxl unet"));
  nn::LoadOptions options;
  options.dtype = bfloat16;
  try {
    unet.load_weights(*file.unet, options);
    ADD_FAILURE() << "a UNet without its first upsampler loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("up_blocks.0.upsamplers.0.conv.weight"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
