// FLUX, SD3 and T5 split over two ranks give the one-rank tensors (f32, within 1e-5) in every execution
// mode, while each rank holds about half of the transformer's weights and reads only its slices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kiln/dist/device_mesh.h"
#include "kiln/dist/process_group.h"
#include "kiln/models/flux2_transformer.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/sd3_transformer.h"
#include "kiln/models/t5_encoder.h"
#include "kiln/runtime/eager_mode.h"
#include "support/golden_steps.h"
#include "support/test_data.h"

namespace kiln {
namespace {

nn::TensorParallel two_ranks() {
  return dist::TensorParallelConfig{.mesh = dist::DeviceMesh("cpu", {2})}.layers();
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<float> x = a.to(float32).to_vector<float>(), y = b.to(float32).to_vector<float>();
  float m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

// Bytes of the parameter tensors this rank holds (what it loaded: its slices and the replicated parts).
size_t held_weight_bytes(nn::Module& model) {
  size_t bytes = 0;
  for (const auto& [name, t] : model.named_parameters())
    if (t->defined()) bytes += t->nbytes();
  return bytes;
}

constexpr float kTolerance = 1e-5f;

TEST(TensorParallelFlux, MatchesOneRankInEveryMode) {
  const auto in = testing::flux_step0_inputs("dev_cat_64x64_s0");
  const std::string folder = testing::data_path("models/" + in.pipeline + "/transformer");
  auto full = models::load_flux_transformer(folder, float32);
  auto shard = models::load_flux_transformer(folder, float32, two_ranks());
  auto run = [&](const models::FluxTransformer2DModel& m) {
    return m.forward(in.hidden, in.encoder_hidden, in.pooled, in.timestep, in.guidance, in.txt_ids,
                     in.img_ids);
  };
  const Tensor expected = run(*full);
  EXPECT_LE(max_abs_diff(run(*shard), expected), kTolerance) << "strict eager";
  {
    EagerModeGuard fuse(EagerMode::DeferAndFuse);
    EXPECT_LE(max_abs_diff(run(*shard), expected), kTolerance) << "deferred and fused";
  }
  shard->compile({.fullgraph = true, .dynamic = false});
  EXPECT_LE(max_abs_diff(run(*shard), expected), kTolerance) << "compiled";
  EXPECT_LE(max_abs_diff(run(*shard), expected), kTolerance) << "compiled, second run";
  shard->reset_compiled();
  shard->compile_repeated_blocks();
  EXPECT_LE(max_abs_diff(run(*shard), expected), kTolerance) << "compiled repeated blocks";
}

TEST(TensorParallelFlux, EachRankHoldsAboutHalfTheWeights) {
  const std::string folder = testing::data_path("models/flux-tiny-dev/transformer");
  auto full = models::load_flux_transformer(folder, float32);
  auto shard = models::load_flux_transformer(folder, float32, two_ranks());
  const size_t one = held_weight_bytes(*full), mine = held_weight_bytes(*shard);
  std::printf("[rank %d] FluxTransformer2DModel weights: %zu bytes on one rank, %zu on this rank (%.3fx)\n",
              dist::rank(), one, mine, static_cast<double>(mine) / static_cast<double>(one));
  EXPECT_LE(static_cast<double>(mine), 0.55 * static_cast<double>(one));
}

// FLUX.2 (models/flux2_blocks.h): heads split, the SwiGLU halves and the single block's five packed blocks
// [q | k | v | gate | up] split block by block, to_out row-parallel over [attention | mlp]; dev with two
// reference images (guidance embedding), and klein (none).
TEST(TensorParallelFlux2, MatchesOneRankInEveryMode) {
  for (const char* golden : {"dev_ref2_auto_s11", "klein_cfg_64x64_s0"}) {
    const auto in = testing::flux2_step0_inputs(golden);
    const std::string folder = testing::data_path("models/" + in.pipeline + "/transformer");
    auto full = models::load_flux2_transformer(folder, float32);
    auto shard = models::load_flux2_transformer(folder, float32, two_ranks());
    auto run = [&](const models::Flux2Transformer2DModel& m) {
      return m.forward(in.hidden, in.encoder_hidden, in.timestep, in.guidance, in.txt_ids, in.img_ids);
    };
    const Tensor expected = run(*full);
    EXPECT_LE(max_abs_diff(expected, in.expected), 1e-4f) << golden;
    EXPECT_LE(max_abs_diff(run(*shard), expected), kTolerance) << golden << " strict eager";
    {
      EagerModeGuard fuse(EagerMode::DeferAndFuse);
      EXPECT_LE(max_abs_diff(run(*shard), expected), kTolerance) << golden << " deferred and fused";
    }
    shard->compile({.fullgraph = true, .dynamic = false});
    EXPECT_LE(max_abs_diff(run(*shard), expected), kTolerance) << golden << " compiled";
    shard->reset_compiled();
    shard->compile_repeated_blocks();
    EXPECT_LE(max_abs_diff(run(*shard), expected), kTolerance) << golden << " compiled repeated blocks";

    const size_t one = held_weight_bytes(*full), mine = held_weight_bytes(*shard);
    std::printf(
        "[rank %d] Flux2Transformer2DModel (%s) weights: %zu bytes on one rank, %zu on this rank (%.3fx)\n",
        dist::rank(), in.pipeline.c_str(), one, mine, static_cast<double>(mine) / static_cast<double>(one));
    EXPECT_LE(static_cast<double>(mine), 0.55 * static_cast<double>(one));
  }
}

TEST(TensorParallelSD3, MatchesOneRankInEveryMode) {
  const auto in = testing::sd3_step0_inputs("medium_cat_64x64_s0");
  const std::string folder = testing::data_path("models/" + in.pipeline + "/transformer");
  auto full = models::load_sd3_transformer(folder, float32);
  auto shard = models::load_sd3_transformer(folder, float32, two_ranks());
  const Tensor expected = full->forward(in.hidden, in.encoder_hidden, in.pooled, in.timestep);
  auto run = [&] { return shard->forward(in.hidden, in.encoder_hidden, in.pooled, in.timestep); };
  EXPECT_LE(max_abs_diff(run(), expected), kTolerance) << "strict eager";
  {
    EagerModeGuard fuse(EagerMode::DeferAndFuse);
    EXPECT_LE(max_abs_diff(run(), expected), kTolerance) << "deferred and fused";
  }
  shard->compile({.fullgraph = true, .dynamic = false});
  EXPECT_LE(max_abs_diff(run(), expected), kTolerance) << "compiled";
  shard->reset_compiled();
  shard->compile_repeated_blocks();
  EXPECT_LE(max_abs_diff(run(), expected), kTolerance) << "compiled repeated blocks";

  const size_t one = held_weight_bytes(*full), mine = held_weight_bytes(*shard);
  std::printf("[rank %d] SD3Transformer2DModel weights: %zu bytes on one rank, %zu on this rank (%.3fx)\n",
              dist::rank(), one, mine, static_cast<double>(mine) / static_cast<double>(one));
  EXPECT_LE(static_cast<double>(mine), 0.55 * static_cast<double>(one));
}

TEST(TensorParallelSD3, HeadsNotDivisibleByRanksIsALoadError) {
  // sd3-tiny-large has 3 heads.
  try {
    models::load_sd3_transformer(testing::data_path("models/sd3-tiny-large/transformer"), float32,
                                 two_ranks());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "num_attention_heads (3) is not divisible by the tensor-parallel degree 2"),
              std::string::npos)
        << e.what();
  }
}

TEST(TensorParallelT5, MatchesOneRank) {
  io::SafetensorsFile golden(testing::data_path("goldens/flux/dev_cat_64x64_s0.safetensors"));
  const std::string folder = testing::data_path("models/flux-tiny-dev/text_encoder_2");
  auto full = models::load_t5_encoder(folder, float32);
  auto shard = models::load_t5_encoder(folder, float32, two_ranks());
  const Tensor ids = golden.tensor("t5_ids");
  const Tensor expected = full->forward(ids);
  EXPECT_LE(max_abs_diff(shard->forward(ids), expected), kTolerance) << "strict eager";
  EagerModeGuard fuse(EagerMode::DeferAndFuse);
  EXPECT_LE(max_abs_diff(shard->forward(ids), expected), kTolerance) << "deferred and fused";
}

}  // namespace
}  // namespace kiln
