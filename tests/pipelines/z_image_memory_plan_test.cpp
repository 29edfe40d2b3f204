// What Z-Image-Turbo's real pipeline holds in memory, and how it is held on a 24 GiB machine: the bf16
// weights of the real transformer and of what the pipeline reads of the real Qwen3-4B
// (tests/data/goldens/z_image/ real_layouts.json, recorded on the meta device), through loaded_weights (the
// family's partial_weights: 35 of 36 layers, no final norm, no lm_head) and plan_offload, as `kiln info
// --max-memory` and set_memory_budget plan them. Each weight is placed in its repeated block by the model
// Kiln builds of the real config.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/pipelines/component_blocks.h"
#include "kiln/pipelines/loaded_weights.h"
#include "kiln/pipelines/offload.h"
#include "support/test_data.h"

namespace kiln {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

const nlohmann::json& layouts() {
  static const nlohmann::json j = [] {
    std::ifstream in(testing::data_path("goldens/z_image/real_layouts.json"));
    return nlohmann::json::parse(in);
  }();
  return j;
}

int64_t numel(const nlohmann::json& shape) {
  int64_t n = 1;
  for (int64_t d : shape.get<std::vector<int64_t>>()) n *= d;
  return n;
}

// A component as `kiln info` sees the real folder: its config, its checkpoint's tensors, and what the
// pipeline reads of them (bf16), each placed in its block.
ComponentWeights real_component(const std::string& name, const std::string& config_key,
                                const std::string& layout, int64_t* read_parameters) {
  const std::string dir = testing::temp_dir("z_image_memory") + "/" + name;
  std::filesystem::create_directories(dir);
  const nlohmann::json& config = layouts()[config_key];
  std::ofstream(dir + "/config.json") << config.dump();
  io::ModelSummary pipeline;
  pipeline.class_name = "ZImagePipeline";
  io::ComponentSummary component;
  component.name = name;
  component.class_name = config.contains("_class_name") ? config["_class_name"] : config["architectures"][0];
  component.path = dir;
  component.has_weights = true;
  for (const auto& [tensor, shape] : layouts()[layout].items()) {
    component.weights.tensor_parameters.emplace_back(tensor, numel(shape));
    component.weights.parameters += numel(shape);
  }
  const LoadedWeights loaded = loaded_weights(pipeline, component);
  const auto blocks = component_block_positions(component);
  ComponentWeights out{name, {}};
  for (const auto& [tensor, n] : loaded.tensors) {
    const auto block = blocks.find(tensor);
    out.tensors.push_back({tensor, n * 2, block == blocks.end() ? nn::BlockPosition{} : block->second});
  }
  *read_parameters = loaded.parameters;
  return out;
}

TEST(ZImageMemoryPlan, TheRealPipelineOnA24GiBMachine) {
  int64_t text = 0, transformer = 0;
  const std::vector<ComponentWeights> pipeline = {
      real_component("text_encoder", "text_encoder_config", "text_encoder", &text),
      real_component("transformer", "transformer_config", "transformer", &transformer)};
  // Qwen3-4B's 4.02 B parameters less its last layer and final norm (hidden_states[-2]); the whole 6.15 B
  // transformer.
  EXPECT_EQ(text, 3'921'534'720);
  EXPECT_EQ(transformer, 6'154'908'736);
  const double gib_text = static_cast<double>(text) * 2 / kGiB,
               gib_transformer = static_cast<double>(transformer) * 2 / kGiB;
  std::printf("Z-Image-Turbo bf16: text encoder as read %.2f GiB, transformer %.2f GiB\n", gib_text,
              gib_transformer);

  // A 24 GiB machine with 20 GiB for the weights (4 GiB left to activations and the system): 18.8 GiB, every
  // component stays in memory (the VAE's 0.16 GiB come on top).
  const OffloadPlan plan = plan_offload(pipeline, 20 * kGiB);
  EXPECT_NEAR(static_cast<double>(plan.weight_bytes) / kGiB, 18.77, 0.01);
  EXPECT_EQ(plan.mode, OffloadMode::None) << plan.describe();
  // 16 GiB: the two do not fit together, the larger alone does: model offload (the text encoder runs first
  // and is released).
  const OffloadPlan model = plan_offload(pipeline, 16 * kGiB);
  EXPECT_EQ(model.mode, OffloadMode::Model) << model.describe();
  EXPECT_EQ(model.largest_component, "transformer");
  // 8 GiB: the transformer streams its blocks in groups.
  const OffloadPlan small = plan_offload(pipeline, 8 * kGiB);
  EXPECT_EQ(small.mode, OffloadMode::Group) << small.describe();
  EXPECT_LE(small.peak_weight_bytes, 8 * kGiB);
  std::printf("at 20 GiB: %s\nat 16 GiB: %s\nat 8 GiB: %s\n", plan.describe().c_str(),
              model.describe().c_str(), small.describe().c_str());
}

}  // namespace
}  // namespace kiln
