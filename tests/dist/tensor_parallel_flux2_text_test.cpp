// FLUX.2's text encoders (the Mistral 3 language model and Qwen3) split over two ranks give the one-rank
// prompt embeddings (f32, within 1e-5) in every execution mode, each rank holding its slices of the layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/dist/device_mesh.h"
#include "kiln/dist/process_group.h"
#include "kiln/models/flux2_prompt_encoder.h"
#include "kiln/runtime/eager_mode.h"
#include "support/test_data.h"

namespace kiln {
namespace {

float max_abs_difference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<float> x = a.to(float32).to_vector<float>(), y = b.to(float32).to_vector<float>();
  float m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

size_t held_bytes(nn::Module& model) {
  size_t bytes = 0;
  for (const auto& [name, t] : model.named_parameters())
    if (t->defined()) bytes += t->nbytes();
  return bytes;
}

Flux2PromptEncoder load(const std::string& family, const nn::TensorParallel& tp) {
  Flux2PromptEncoderOptions options;
  options.text_encoder_out_layers = {1, 3, 5};
  options.tp = tp;
  return Flux2PromptEncoder::from_pretrained(testing::data_path("models/flux2-tiny-text/" + family), options);
}

TEST(TensorParallelFlux2Text, MatchesOneRankInEveryMode) {
  const nn::TensorParallel tp = dist::TensorParallelConfig{.mesh = dist::DeviceMesh("cpu", {2})}.layers();
  const std::vector<std::string> prompts = {"a golden retriever surfing", "", "Crème brûlée 🐶"};
  for (const char* family : {"dev", "klein"}) {
    const Tensor expected = load(family, {}).encode(prompts, 24).prompt_embeds;
    auto shard = load(family, tp);
    auto full = load(family, {});
    const size_t one = held_bytes(full.text_encoder()), mine = held_bytes(shard.text_encoder());
    std::printf("[rank %d] %s text encoder weights: %zu bytes on one rank, %zu on this rank (%.3fx)\n",
                dist::rank(), family, one, mine, static_cast<double>(mine) / static_cast<double>(one));
    EXPECT_LT(mine, one);
    EXPECT_LE(max_abs_difference(shard.encode(prompts, 24).prompt_embeds, expected), 1e-5f)
        << family << " eager";
    {
      EagerModeGuard fuse(EagerMode::DeferAndFuse);
      EXPECT_LE(max_abs_difference(shard.encode(prompts, 24).prompt_embeds, expected), 1e-5f)
          << family << " fused";
    }
    shard.text_encoder().compile({.fullgraph = true, .dynamic = false});
    EXPECT_LE(max_abs_difference(shard.encode(prompts, 24).prompt_embeds, expected), 1e-5f)
        << family << " compiled";
    shard.text_encoder().reset_compiled();
    shard.text_encoder().compile_repeated_blocks();
    EXPECT_LE(max_abs_difference(shard.encode(prompts, 24).prompt_embeds, expected), 1e-5f)
        << family << " compiled repeated blocks";
  }
}

}  // namespace
}  // namespace kiln
