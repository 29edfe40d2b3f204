// Each model's repeated_blocks(): the lists compile_repeated_blocks and group offload work from. Built from
// the tiny pipelines' configs and the real ones (tests/data/goldens/*/real_layouts.json), unloaded.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/models/autoencoder_kl_flux2.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/flux2_transformer.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/sd3_transformer.h"
#include "kiln/models/t5_encoder.h"
#include "kiln/nn/block_positions.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using Lists = std::vector<std::pair<std::string, int64_t>>;  // (list name, blocks)

std::string config(const std::string& folder) {
  return testing::data_path("models/" + folder + "/config.json");
}

// The config of `key` in a real layout file, as JSON text.
std::string real_config(const std::string& golden, const std::string& key) {
  std::ifstream file(testing::data_path("goldens/" + golden + "/real_layouts.json"));
  return nlohmann::json::parse(file).at("configs").at(key).dump();
}

// `model` declares `expected`, and each block's parameters are exactly the model's parameters under
// "<list>.<i>." (the same slots), registered in the order the lists are declared; parameter_block_positions
// places each parameter accordingly.
void expect_blocks(nn::Module& model, const Lists& expected) {
  const std::vector<nn::BlockList> lists = model.repeated_blocks();
  Lists declared;
  for (const nn::BlockList& list : lists) declared.emplace_back(list.name, list.blocks.size());
  ASSERT_EQ(declared, expected);

  const auto all = model.named_parameters();
  std::map<std::string, std::pair<size_t, Tensor*>> registered;  // name -> (position, slot)
  for (size_t i = 0; i < all.size(); ++i) registered[all[i].first] = {i, all[i].second};
  std::map<std::string, nn::BlockPosition> placed;  // what each name says about its block
  size_t next = 0;
  for (const nn::BlockList& list : lists) {
    for (size_t i = 0; i < list.blocks.size(); ++i) {
      const std::string prefix = list.name + "." + std::to_string(i) + ".";
      const auto params = list.blocks[i]->named_parameters(prefix);
      EXPECT_FALSE(params.empty()) << prefix;
      for (const auto& [name, slot] : params) {
        const auto it = registered.find(name);
        ASSERT_TRUE(it != registered.end()) << name << ": not a parameter of the model by that name";
        EXPECT_EQ(it->second.second, slot) << name << ": the model holds another slot by that name";
        EXPECT_GE(it->second.first, next) << name << ": registered before the blocks declared ahead of it";
        next = it->second.first + 1;
        placed[name] = {list.name, static_cast<int64_t>(i)};
      }
    }
  }
  const std::vector<nn::BlockPosition> positions = nn::parameter_block_positions(model);
  ASSERT_EQ(positions.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string& name = all[i].first;
    const auto it = placed.find(name);
    EXPECT_EQ(positions[i], it == placed.end() ? nn::BlockPosition{} : it->second) << name;
    for (const nn::BlockList& list : lists)
      EXPECT_TRUE(it != placed.end() || name.rfind(list.name + ".", 0) != 0)
          << name << " is named under " << list.name << " but belongs to none of its blocks";
  }
}

TEST(RepeatedBlocks, FluxTransformer) {
  for (const std::string& text :
       {std::string(), real_config("flux", "transformer_dev"), real_config("flux", "transformer_schnell")}) {
    const auto c = text.empty()
                       ? models::FluxTransformerConfig::from_file(config("flux-tiny-dev/transformer"))
                       : models::FluxTransformerConfig::from_json(text);
    models::FluxTransformer2DModel model(c);
    expect_blocks(model,
                  {{"transformer_blocks", c.num_layers}, {"single_transformer_blocks", c.num_single_layers}});
  }
  EXPECT_EQ(
      models::FluxTransformerConfig::from_json(real_config("flux", "transformer_dev")).num_single_layers, 38);
}

TEST(RepeatedBlocks, Flux2Transformer) {
  for (const std::string& text : {std::string(), real_config("flux2", "transformer_dev"),
                                  real_config("flux2", "transformer_klein_4b")}) {
    const auto c = text.empty()
                       ? models::Flux2TransformerConfig::from_file(config("flux2-tiny-dev/transformer"))
                       : models::Flux2TransformerConfig::from_json(text);
    models::Flux2Transformer2DModel model(c);
    expect_blocks(model,
                  {{"transformer_blocks", c.num_layers}, {"single_transformer_blocks", c.num_single_layers}});
  }
}

TEST(RepeatedBlocks, SD3Transformer) {
  for (const std::string& text :
       {std::string(), real_config("sd3", "transformer_medium"), real_config("sd3", "transformer_large")}) {
    const auto c = text.empty()
                       ? models::SD3TransformerConfig::from_file(config("sd3-tiny-medium/transformer"))
                       : models::SD3TransformerConfig::from_json(text);
    models::SD3Transformer2DModel model(c);
    expect_blocks(model, {{"transformer_blocks", c.num_layers}});
  }
}

TEST(RepeatedBlocks, DecoderTextEncoderHasTheLayersBuilt) {
  for (const char* folder : {"flux2-tiny-dev-full/text_encoder", "flux2-tiny-klein-full/text_encoder"}) {
    const auto c = models::DecoderTextEncoderConfig::from_file(config(folder));
    models::DecoderTextEncoder all(c, -1, true);
    expect_blocks(all, {{"layers", c.num_hidden_layers}});
    models::DecoderTextEncoder first(c, 3, false);
    expect_blocks(first, {{"layers", 3}});
  }
}

TEST(RepeatedBlocks, T5AndClipTextEncoders) {
  const auto t5 = models::T5EncoderConfig::from_file(config("flux-tiny-dev/text_encoder_2"));
  models::T5EncoderModel t5_model(t5);
  expect_blocks(t5_model, {{"encoder.block", t5.num_layers}});
  for (const char* folder : {"flux-tiny-dev/text_encoder", "sd3-tiny-medium/text_encoder_2"}) {
    const auto clip = models::ClipTextConfig::from_file(config(folder));
    models::ClipTextModel clip_model(clip);
    expect_blocks(clip_model, {{"text_model.encoder.layers", clip.num_hidden_layers}});
  }
}

TEST(RepeatedBlocks, AutoencoderStages) {
  const auto c = models::AutoencoderKLConfig::from_file(config("flux-tiny-dev/vae"));
  models::AutoencoderKL vae(c);
  const auto stages = static_cast<int64_t>(c.block_out_channels.size());
  expect_blocks(vae, {{"encoder.down_blocks", stages}, {"decoder.up_blocks", stages}});
  models::AutoencoderKLFlux2 flux2(
      models::AutoencoderKLConfig::from_file(config("flux2-tiny-klein-full/vae")));
  expect_blocks(flux2, {{"encoder.down_blocks", stages}, {"decoder.up_blocks", stages}});
  // The mid blocks are no list's: they stay while the VAE runs.
  const auto positions = nn::block_positions_by_name(vae);
  EXPECT_FALSE(positions.at("decoder.mid_block.resnets.1.conv1.weight").in_block());
  EXPECT_EQ(positions.at("decoder.up_blocks.2.upsamplers.0.conv.weight"),
            (nn::BlockPosition{"decoder.up_blocks", 2}));
}

// That the blocks share one program per list is measured in execution_modes_test.cpp.
TEST(RepeatedBlocks, CompileRepeatedBlocksCompilesEveryBlockAndNothingElse) {
  models::FluxTransformer2DModel model(
      models::FluxTransformerConfig::from_file(config("flux-tiny-dev/transformer")));
  model.compile_repeated_blocks();
  EXPECT_FALSE(model.is_compiled()) << "only the blocks are compiled";
  for (const nn::BlockList& list : model.repeated_blocks())
    for (const nn::Module* block : list.blocks) EXPECT_TRUE(block->is_compiled()) << list.name;
}

TEST(RepeatedBlocks, BlocksThatCannotCompileAreRefusedByName) {
  models::T5EncoderModel t5(models::T5EncoderConfig::from_file(config("flux-tiny-dev/text_encoder_2")));
  try {
    t5.compile_repeated_blocks();
    ADD_FAILURE() << "T5's blocks were compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("encoder.block"), std::string::npos) << e.what();
  }
  for (const nn::BlockList& list : t5.repeated_blocks())
    for (const nn::Module* block : list.blocks) EXPECT_FALSE(block->is_compiled());
}

}  // namespace
}  // namespace kiln
