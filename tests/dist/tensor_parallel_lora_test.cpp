// LoRA adapters on pipelines split over two ranks (A split like the base weight's input, B like its output):
// each rank's image is the one-rank image and diffusers' (tools/goldens/lora.py), unfused and fused, on
// FLUX.1 (column, row and gathered layers: qkv, output projections, modulations; proj_out's [attention | mlp]
// input), SD3 (both CLIP encoders too) and FLUX.2 [klein] (its packed single-block projections).
#include <gtest/gtest.h>

#include "kiln/nn/layers.h"
#include "lora/lora_goldens.h"

namespace kiln {
namespace {

using testing::LoraGolden;

int max_level_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  int m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(int(a[i]) - int(b[i])));
  return m;
}

std::vector<uint8_t> run(const LoraGolden& g, int ranks, std::optional<ExecutionMode> mode = std::nullopt) {
  PipelineLoadOptions options;
  options.tensor_parallel = ranks;
  auto pipe = g.load(options);
  g.replay(*pipe);
  if (mode) pipe->configure({.mode = mode});
  return (*pipe)(g.request()).images[0].pixels;
}

TEST(TensorParallelLora, TwoRanksDrawTheOneRankImage) {
  for (const char* name : {"flux_two_adapters", "flux_two_adapters_fused", "sd3_two_adapters_fused",
                           "flux2_kohya", "flux2_two_adapters_fused"}) {
    SCOPED_TRACE(name);
    const LoraGolden g(name);
    const auto split = run(g, 2);
    EXPECT_LE(max_level_difference(split, run(g, 1)), 1);
    EXPECT_GE(testing::share_within_one_level(split, g.image()), 0.99);
  }
}

// Each rank holds its slice of the adapters: B's rows under a column-parallel layer, A's columns under a
// row-parallel one.
TEST(TensorParallelLora, EachRankHoldsItsSlice) {
  const LoraGolden g("flux_two_adapters");
  PipelineLoadOptions options;
  options.tensor_parallel = 2;
  auto pipe = g.load(options);
  g.replay(*pipe);
  std::map<std::string, nn::Linear*> layers;
  for (const auto& [name, module] : pipe->denoiser().named_modules())
    if (auto* l = dynamic_cast<nn::Linear*>(module)) layers[name] = l;
  const nn::Linear& to_q = *layers.at("transformer_blocks.0.attn.to_q");
  // 32 rows over two ranks; style's rank 4 and detail's (kohya's fused qkv) 4, stacked.
  EXPECT_EQ(to_q.lora_up().shape(), (Shape{16, 8}));
  EXPECT_EQ(to_q.lora_down().shape(), (Shape{8, 32}));  // the whole input
  const nn::Linear& to_out = *layers.at("transformer_blocks.0.attn.to_out.0");
  EXPECT_EQ(to_out.lora_down().shape(), (Shape{6, 16}));  // ranks 2 + 4
  EXPECT_EQ(to_out.lora_up().shape(), (Shape{32, 6}));
  // proj_out reads [attention 32 | mlp 128]: each rank's A columns are its half of each block.
  EXPECT_EQ(layers.at("single_transformer_blocks.1.proj_out")->lora_down().shape(), (Shape{8, 80}));
}

TEST(TensorParallelLora, CompiledBlocksUnderTensorParallelism) {
  const LoraGolden g("flux_two_adapters");
  EXPECT_GE(testing::share_within_one_level(run(g, 2, ExecutionMode::CompileBlocks), g.image()), 0.99);
}

}  // namespace
}  // namespace kiln
