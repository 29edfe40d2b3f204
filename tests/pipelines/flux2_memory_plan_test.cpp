// What the real FLUX.2 pipelines need in memory and how they are held under a budget: the bf16 weights of the
// real transformers and VAE (tests/data/goldens/flux2/real_layouts.json, built by diffusers' classes on the
// meta device) and of the real text encoders (tests/data/goldens/flux2_text/real_layouts.json, transformers'
// classes), through plan_offload, as set_memory_budget and `kiln info --max-memory` plan them. The text
// encoders count what the pipelines read of them (loaded_weights: the embedding and the layers their default
// text_encoder_out_layers need), checked against the real names and shapes. Each weight is placed in its
// repeated block by the model Kiln builds of the real config (component_block_positions, as kiln info does).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "kiln/core/error.h"
#include "kiln/pipelines/component_blocks.h"
#include "kiln/pipelines/loaded_weights.h"
#include "kiln/pipelines/offload.h"
#include "support/test_data.h"

namespace kiln {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// `tensor` with its block in the model Kiln builds of the component (as `kiln info` places it).
ComponentWeight real_weight(const std::string& tensor, int64_t bytes,
                            const std::map<std::string, nn::BlockPosition>& blocks) {
  const auto block = blocks.find(tensor);
  return {tensor, bytes, block == blocks.end() ? nn::BlockPosition{} : block->second};
}

std::vector<ComponentWeights> real_components(const std::string& transformer) {
  std::ifstream file(testing::data_path("goldens/flux2/real_layouts.json"));
  const nlohmann::json layouts = nlohmann::json::parse(file);
  std::vector<ComponentWeights> out;
  for (const auto& [name, key] :
       std::vector<std::pair<std::string, std::string>>{{"transformer", transformer}, {"vae", "vae"}}) {
    io::ComponentSummary component;
    component.class_name = layouts["configs"][key]["_class_name"];
    component.path = testing::temp_dir("flux2_memory_" + key);
    std::ofstream(component.path + "/config.json") << layouts["configs"][key].dump();
    const auto blocks = component_block_positions(component);
    ComponentWeights c{name, {}};
    for (const auto& [tensor, shape] : layouts.at(key).items()) {
      int64_t numel = 1;
      for (int64_t d : shape.get<std::vector<int64_t>>()) numel *= d;
      c.tensors.push_back(real_weight(tensor, numel * 2, blocks));  // bf16
    }
    out.push_back(std::move(c));
  }
  return out;
}

TEST(Flux2MemoryPlan, WhatRunsUnderA20GiBBudget) {
  // A 24 GiB machine, 4 GiB left to activations and the system.
  const int64_t budget = 20 * kGiB;
  // FLUX.2-dev: 32.2 B parameters, 60.0 GiB of bf16 weights; blocks of up to 1.83 GiB stream in groups.
  const OffloadPlan dev = plan_offload(real_components("transformer_dev"), budget);
  EXPECT_NEAR(static_cast<double>(dev.weight_bytes) / kGiB, 60.2, 0.1);
  EXPECT_EQ(dev.mode, OffloadMode::Group) << dev.describe();
  EXPECT_LE(dev.peak_weight_bytes, budget);
  // klein 9B: 16.9 GiB + the VAE fits whole; klein 4B: 7.2 GiB.
  const OffloadPlan k9 = plan_offload(real_components("transformer_klein_9b"), budget);
  EXPECT_NEAR(static_cast<double>(k9.weight_bytes) / kGiB, 17.1, 0.1);
  EXPECT_EQ(k9.mode, OffloadMode::None) << k9.describe();
  const OffloadPlan k4 = plan_offload(real_components("transformer_klein_4b"), budget);
  EXPECT_NEAR(static_cast<double>(k4.weight_bytes) / kGiB, 7.4, 0.1);
  EXPECT_EQ(k4.mode, OffloadMode::None) << k4.describe();
  // Under 8 GiB klein 9B streams its blocks; klein 4B still fits whole.
  EXPECT_EQ(plan_offload(real_components("transformer_klein_9b"), 8 * kGiB).mode, OffloadMode::Group);
  EXPECT_EQ(plan_offload(real_components("transformer_klein_4b"), 8 * kGiB).mode, OffloadMode::None);
  for (const auto& [name, plan] : {std::pair{"dev", dev}, {"klein 9B", k9}, {"klein 4B", k4}})
    std::printf("FLUX.2 %s at 20 GiB: %s\n", name, plan.describe().c_str());
}

const nlohmann::json& text_layouts() {
  static const nlohmann::json j = [] {
    std::ifstream in(testing::data_path("goldens/flux2_text/real_layouts.json"));
    return nlohmann::json::parse(in);
  }();
  return j;
}

// The text encoder as `kiln info` sees a real folder: its config and its checkpoint's tensors; what the
// pipeline reads of them, each checked against the real layout's name (under the module tree's prefix) and
// size.
ComponentWeights real_text_encoder(const std::string& key, const std::string& prefix, int64_t* parameters) {
  const std::string dir = testing::temp_dir("flux2_memory_" + key) + "/text_encoder";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << text_layouts()["configs"][key].dump();
  io::ModelSummary pipeline;
  pipeline.class_name = key.rfind("flux2_dev", 0) == 0 ? "Flux2Pipeline" : "Flux2KleinPipeline";
  io::ComponentSummary component;
  component.name = "text_encoder";
  component.class_name = text_layouts()["configs"][key]["architectures"][0];
  component.path = dir;
  component.has_weights = true;
  std::map<std::string, int64_t> real;
  for (const auto& [tensor, shape] : text_layouts()["layouts"][key].items()) {
    int64_t numel = 1;
    for (int64_t d : shape.get<std::vector<int64_t>>()) numel *= d;
    real[tensor] = numel;
    component.weights.tensor_parameters.emplace_back(tensor, numel);
    component.weights.parameters += numel;
  }
  const LoadedWeights loaded = loaded_weights(pipeline, component);
  EXPECT_FALSE(loaded.note.empty()) << key;
  const auto blocks = component_block_positions(component);
  ComponentWeights c{"text_encoder", {}};
  for (const auto& [tensor, numel] : loaded.tensors) {
    const auto it = real.find(prefix + tensor);
    EXPECT_TRUE(it != real.end() && it->second == numel)
        << key << ": " << tensor << " is not in the real layout";
    c.tensors.push_back(real_weight(tensor, numel * 2, blocks));  // bf16
  }
  *parameters = loaded.parameters;
  return c;
}

std::vector<ComponentWeights> real_pipeline(const std::string& text_encoder, const std::string& transformer,
                                            int64_t* text_parameters) {
  const std::string prefix = text_encoder == "flux2_dev_text_encoder" ? "model.language_model." : "model.";
  std::vector<ComponentWeights> out{real_text_encoder(text_encoder, prefix, text_parameters)};
  for (ComponentWeights& c : real_components(transformer)) out.push_back(std::move(c));
  return out;
}

double gib(int64_t bytes) {
  return static_cast<double>(bytes) / kGiB;
}

TEST(Flux2MemoryPlan, WhatWholePipelinesNeedOnA24GiBMachine) {
  // The text encoder runs first and is released before the transformer runs (model offload and finer).
  int64_t dev_text = 0, k4_text = 0, k9_text = 0;
  const auto dev = real_pipeline("flux2_dev_text_encoder", "transformer_dev", &dev_text);
  const auto k4 = real_pipeline("klein_4b_text_encoder", "transformer_klein_4b", &k4_text);
  const auto k9 = real_pipeline("klein_9b_text_encoder", "transformer_klein_9b", &k9_text);
  // What the pipelines read of the text encoders (docs/flux2_text.md's table): 30 of Mistral Small's 40
  // layers, 27 of Qwen3's 36.
  EXPECT_EQ(dev_text, 17343754240);
  EXPECT_EQ(k4_text, 3114088192);
  EXPECT_EQ(k9_text, 5831883520);

  const int64_t budget = 20 * kGiB;  // a 24 GiB machine, 4 GiB left to activations and the system
  // FLUX.2-dev: 32.3 GiB of text encoder + 60.2 GiB of transformer and VAE: both stream in groups of blocks.
  const OffloadPlan d = plan_offload(dev, budget);
  EXPECT_NEAR(gib(d.weight_bytes), 92.5, 0.1);
  EXPECT_EQ(d.mode, OffloadMode::Group) << d.describe();
  EXPECT_EQ(d.largest_tensor, "text_encoder: embed_tokens.weight");
  EXPECT_NEAR(gib(d.largest_tensor_bytes), 1.25, 0.001);  // 131072 x 5120
  EXPECT_LE(d.peak_weight_bytes, budget);
  // klein 4B: 5.8 + 7.2 + 0.16 GiB fit whole; klein 9B: 10.9 + 16.9 + 0.16 GiB do not, but its largest
  // component does: model offload.
  const OffloadPlan p4 = plan_offload(k4, budget);
  EXPECT_NEAR(gib(p4.weight_bytes), 13.2, 0.1);
  EXPECT_EQ(p4.mode, OffloadMode::None) << p4.describe();
  const OffloadPlan p9 = plan_offload(k9, budget);
  EXPECT_NEAR(gib(p9.weight_bytes), 27.9, 0.1);
  EXPECT_EQ(p9.mode, OffloadMode::Model) << p9.describe();
  EXPECT_EQ(p9.largest_component, "transformer");
  // The least each needs: the largest tensor (sequential offload) -- FLUX.2-dev's embedding, 1.25 GiB;
  // below it plan_offload refuses before any work, naming it.
  EXPECT_EQ(plan_offload(dev, 2 * kGiB).mode, OffloadMode::Sequential);
  try {
    plan_offload(dev, kGiB);
    ADD_FAILURE() << "a budget below the embedding was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embed_tokens.weight"), std::string::npos) << e.what();
  }
  // Group offload with one block per group needs the weights outside blocks plus two blocks (prefetch):
  // the smallest budget that keeps FLUX.2-dev in groups.
  int64_t low = 2 * kGiB, high = budget;
  while (high - low > (int64_t{1} << 24)) {
    const int64_t mid = (low + high) / 2;
    (plan_offload(dev, mid).mode == OffloadMode::Group ? high : low) = mid;
  }
  EXPECT_GT(gib(high), 3.0);
  EXPECT_LT(gib(high), 6.0);
  for (const auto& [name, plan] : {std::pair{"dev", d}, {"klein 4B", p4}, {"klein 9B", p9}})
    std::printf("FLUX.2 %s pipeline at 20 GiB: %s\n%s\n", name, plan.describe().c_str(),
                plan.describe_residency().c_str());
  std::printf("FLUX.2-dev: group offload from %.2f GiB, sequential from %.2f GiB\n", gib(high),
              gib(d.largest_tensor_bytes));
}

}  // namespace
}  // namespace kiln
