// What the real FLUX.2 image side needs in memory and how it is held under a budget: the bf16 weights of the
// real transformers and VAE (from tests/data/goldens/flux2/real_layouts.json, built by diffusers' classes on
// the meta device) through plan_offload, as set_memory_budget plans them. The text encoders
// (Mistral-Small 3.x for FLUX.2-dev, Qwen3 for klein) run before the transformer and are released by model
// offload; they are not counted here.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/pipelines/offload.h"
#include "support/test_data.h"

namespace kiln {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

std::vector<ComponentWeights> real_components(const std::string& transformer) {
  std::ifstream file(testing::data_path("goldens/flux2/real_layouts.json"));
  const nlohmann::json layouts = nlohmann::json::parse(file);
  std::vector<ComponentWeights> out;
  for (const auto& [name, key] :
       std::vector<std::pair<std::string, std::string>>{{"transformer", transformer}, {"vae", "vae"}}) {
    ComponentWeights c{name, {}};
    for (const auto& [tensor, shape] : layouts.at(key).items()) {
      int64_t numel = 1;
      for (int64_t d : shape.get<std::vector<int64_t>>()) numel *= d;
      c.tensors.emplace_back(tensor, numel * 2);  // bf16
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

}  // namespace
}  // namespace kiln
