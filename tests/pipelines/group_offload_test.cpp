// Group offloading in the pipelines (enable_group_offload, and set_memory_budget picking it): the image is
// bit-identical to the run without offloading in every execution mode, the groups follow the blocks, and the
// plan's arithmetic (issue #13). The resident set itself is measured in tests/runtime/weight_groups_test.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/families/sd3/sd3_pipeline.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/ops/linalg.h"
#include "kiln/pipelines/offload.h"
#include "kiln/runtime/eager_mode.h"
#include "kiln/runtime/execution_context.h"
#include "kiln/runtime/weight_groups.h"
#include "pipelines/model_offload.h"
#include "support/test_data.h"

namespace kiln {
namespace {

PipelineRequest tiny_flux_call(uint64_t seed) {
  return {.prompt = "an orange cube",
          .height = 32,
          .width = 32,
          .num_inference_steps = 2,
          .guidance_scale = 3.5f,
          .generator = Generator(seed),
          .max_sequence_length = 16};
}

// Restores the process-wide budgets and groups a test changes.
class OffloadScope {
 public:
  OffloadScope() : packed_(packed_weight_budget()) {}
  ~OffloadScope() {
    clear_weight_groups();
    set_resident_weight_budget(std::nullopt);
    set_packed_weight_budget(packed_);
  }

 private:
  std::optional<int64_t> packed_;
};

// The weights of the tiny FLUX.1 transformer (2 double-stream and 2 single-stream blocks) are put in the
// blocks whose modules hold them, and groups are made of consecutive blocks of one list.
TEST(BlockGroups, FollowTheRepeatedBlocksOfTheModel) {
  const auto model =
      models::load_flux_transformer(testing::data_path("models/flux-tiny-dev-bf16/transformer"), bfloat16);
  const std::vector<ComponentWeights> weights = component_weights({{"transformer", model.get()}});
  ASSERT_EQ(weights.size(), 1u);
  std::map<std::string, nn::BlockPosition> position;
  for (const ComponentWeight& w : weights[0].tensors) position[w.name] = w.block;
  EXPECT_EQ(position.at("transformer_blocks.1.attn.to_q.weight"),
            (nn::BlockPosition{"transformer_blocks", 1}));
  EXPECT_EQ(position.at("single_transformer_blocks.0.proj_out.bias"),
            (nn::BlockPosition{"single_transformer_blocks", 0}));
  EXPECT_FALSE(position.at("x_embedder.weight").in_block());
  EXPECT_FALSE(position.at("norm_out.linear.weight").in_block());

  const auto names = [](const std::vector<WeightGroup>& groups) {
    std::vector<std::string> out;
    for (const WeightGroup& g : groups) out.push_back(g.component + ": " + g.name);
    return out;
  };
  EXPECT_EQ(names(pipelines::block_groups({{"transformer", model.get()}}, 1)),
            (std::vector<std::string>{
                "transformer: transformer_blocks.0", "transformer: transformer_blocks.1",
                "transformer: single_transformer_blocks.0", "transformer: single_transformer_blocks.1"}));
  const std::vector<WeightGroup> groups = pipelines::block_groups({{"transformer", model.get()}}, 3);
  EXPECT_EQ(names(groups), (std::vector<std::string>{"transformer: transformer_blocks.0-1",
                                                     "transformer: single_transformer_blocks.0-1"}))
      << "a group never spans two lists";
  // Each group holds exactly the weights placed in its blocks.
  std::map<const void*, std::string> group_of;
  for (const WeightGroup& g : groups)
    for (const Tensor& t : g.weights) group_of[t.raw_data()] = g.name;
  size_t in_blocks = 0;
  for (const auto& [name, slot] : model->named_parameters()) {
    const nn::BlockPosition& p = position.at(name);
    const auto it = group_of.find(slot->raw_data());
    if (!p.in_block()) {
      EXPECT_TRUE(it == group_of.end()) << name << " is outside the blocks but in group " << it->second;
      continue;
    }
    ++in_blocks;
    ASSERT_TRUE(it != group_of.end()) << name << " is in no group";
    EXPECT_EQ(it->second, p.list + ".0-1") << name;
  }
  EXPECT_EQ(group_of.size(), in_blocks);
}

ComponentWeight in_block(const std::string& list, int64_t block, int64_t bytes) {
  return {list + "." + std::to_string(block) + ".w", bytes, {list, block}};
}

// A transformer of 4 double blocks (10 bytes each) and 8 single blocks (5 each) with 6 bytes outside them,
// and an encoder of 3 blocks (4 each) with 20 bytes of embeddings.
std::vector<ComponentWeights> toy_model() {
  ComponentWeights encoder{"text_encoder", {{"shared.weight", 20}}};
  for (int i = 0; i < 3; ++i) encoder.tensors.push_back(in_block("encoder.block", i, 4));
  ComponentWeights transformer{"transformer", {{"x_embedder.weight", 6}}};
  for (int i = 0; i < 4; ++i) transformer.tensors.push_back(in_block("transformer_blocks", i, 10));
  for (int i = 0; i < 8; ++i) transformer.tensors.push_back(in_block("single_transformer_blocks", i, 5));
  return {encoder, transformer};
}

TEST(OffloadPlan, PicksTheLargestGroupsThatFit) {
  // Everything: 118 bytes; model offload: 86 (the transformer). Under groups of k blocks the transformer
  // holds its 6 outside bytes plus two consecutive groups (wrapping around): k=4: 6 + 40 + 20 = 66; k=3
  // (groups 30, 10 | 15, 15, 10): 6 + 30 + 10 = 46; k=2: 6 + 20 + 20 = 46 too; k=1: 6 + 10 + 10 = 26. The
  // encoder holds 20 + 4 + 4 = 28 with single blocks, all its 32 bytes with larger groups.
  const auto plan_for = [](int64_t budget) { return plan_offload(toy_model(), budget); };
  EXPECT_EQ(plan_for(118).mode, OffloadMode::None);
  EXPECT_EQ(plan_for(86).mode, OffloadMode::Model);
  OffloadPlan p = plan_for(66);
  EXPECT_EQ(p.mode, OffloadMode::Group) << p.describe();
  EXPECT_EQ(p.group.blocks_per_group, 4);
  EXPECT_EQ(p.peak_weight_bytes, 66);
  p = plan_for(46);
  EXPECT_EQ(p.group.blocks_per_group, 3) << p.describe();
  EXPECT_EQ(p.peak_weight_bytes, 46);
  p = plan_for(45);
  EXPECT_EQ(p.mode, OffloadMode::Group) << p.describe();
  EXPECT_EQ(p.group.blocks_per_group, 1);
  EXPECT_EQ(p.components[0].peak, 28);
  EXPECT_EQ(p.components[1].peak, 26);
  EXPECT_EQ(p.components[1].blocks, 12);
  EXPECT_EQ(p.components[1].outside_blocks, 6);
  EXPECT_EQ(p.components[1].largest_group, 10);
  EXPECT_EQ(p.peak_weight_bytes, 28);
  EXPECT_EQ(plan_for(28).mode, OffloadMode::Group);
  EXPECT_EQ(plan_for(27).mode, OffloadMode::Sequential) << "the encoder's 28 bytes do not fit";
  EXPECT_EQ(plan_for(20).mode, OffloadMode::Sequential);
  EXPECT_THROW(plan_for(19), Error) << "below the largest tensor (20 bytes)";
  const std::string residency = plan_for(45).describe_residency();
  EXPECT_NE(residency.find("transformer"), std::string::npos) << residency;
  EXPECT_NE(residency.find("expected peak: 28 B"), std::string::npos) << residency;
}

// The image with group offloading equals the image without it, in each execution mode; the transformer's
// blocks are switched between as groups and the next group was prefetched.
TEST(GroupOffload, EveryExecutionModeKeepsItsImage) {
  OffloadScope scope;
  PipelineLoadOptions options{.dtype = bfloat16};
  for (const std::string mode : {"eager", "fuse", "compile", "compile-blocks"}) {
    const auto run = [&](bool offload, WeightGroupStats* stats, size_t* programs) {
      auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev-bf16"), options);
      if (mode == "compile") pipe.transformer().compile({.fullgraph = true, .dynamic = false});
      if (mode == "compile-blocks") pipe.transformer().compile_repeated_blocks();
      if (offload) pipe.enable_group_offload({.blocks_per_group = 1, .prefetch = true});
      std::optional<EagerModeGuard> fuse;
      if (mode == "fuse") fuse.emplace(EagerMode::DeferAndFuse);
      std::vector<uint8_t> pixels = pipe(tiny_flux_call(11)).images[0].pixels;
      // A second call: streaming the groups again must not compile anything new.
      if (offload) {
        EXPECT_EQ(pipe(tiny_flux_call(11)).images[0].pixels, pixels) << mode;
      }
      if (stats != nullptr) *stats = pipe.context().memory().weight_group_stats();
      *programs = pipe.transformer().compiled_program_count();
      clear_weight_groups();
      set_packed_weight_budget(std::nullopt);
      return pixels;
    };
    WeightGroupStats stats;
    size_t programs_offloaded = 0, programs_plain = 0;
    EXPECT_EQ(run(true, &stats, &programs_offloaded), run(false, nullptr, &programs_plain)) << mode;
    EXPECT_EQ(programs_offloaded, programs_plain)
        << mode << ": weights are program inputs, streaming recompiles nothing";
    EXPECT_GT(stats.groups, 4) << mode;
    // Two steps through the tiny transformer's blocks at least, most of them prefetched.
    EXPECT_GE(stats.switches, 8) << mode;
    EXPECT_GT(stats.prefetch_hits, stats.switches / 2) << mode;
  }
}

TEST(GroupOffload, MemoryBudgetBetweenModelAndSequentialPicksGroupsAndKeepsTheImage) {
  OffloadScope scope;
  const PipelineRequest call = tiny_flux_call(12);
  PipelineLoadOptions options{.dtype = bfloat16};
  const auto load = [&] {
    return FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev-bf16"), options);
  };
  std::vector<uint8_t> unbudgeted;
  OffloadPlan probe;
  {
    auto pipe = load();
    unbudgeted = pipe(call).images[0].pixels;
    probe = pipe.set_memory_budget(int64_t{1} << 40);
  }
  auto pipe = load();
  std::optional<int64_t> group_budget;
  for (int64_t b = probe.largest_tensor_bytes; b < probe.largest_component_bytes && !group_budget; b += 256)
    if (pipe.set_memory_budget(b).mode == OffloadMode::Group) group_budget = b;
  ASSERT_TRUE(group_budget) << "no budget between the largest weight and the largest component picks groups";
  const OffloadPlan plan = pipe.set_memory_budget(*group_budget);
  EXPECT_EQ(plan.mode, OffloadMode::Group);
  EXPECT_LE(plan.peak_weight_bytes, *group_budget);
  EXPECT_EQ(pipe(call).images[0].pixels, unbudgeted) << plan.describe();
  EXPECT_GT(pipe.context().memory().weight_group_stats().switches, 0);
}

TEST(GroupOffload, StableDiffusion3KeepsItsImage) {
  OffloadScope scope;
  const PipelineRequest call{.prompt = "a red sphere",
                             .height = 32,
                             .width = 32,
                             .num_inference_steps = 2,
                             .generator = Generator(4),
                             .max_sequence_length = 16};
  // float32, the checkpoint's dtype: the weights stay file pages, which is what groups send out.
  const auto run = [&](std::optional<int> blocks_per_group) {
    auto pipe = StableDiffusion3Pipeline::from_pretrained(testing::data_path("models/sd3-tiny-medium"),
                                                          {.dtype = float32});
    if (blocks_per_group) pipe.enable_group_offload({.blocks_per_group = *blocks_per_group});
    std::vector<uint8_t> pixels = pipe(call).images[0].pixels;
    if (blocks_per_group) {
      EXPECT_GT(pipe.context().memory().weight_group_stats().switches, 2) << *blocks_per_group;
    }
    clear_weight_groups();
    set_packed_weight_budget(std::nullopt);
    return pixels;
  };
  const std::vector<uint8_t> plain = run(std::nullopt);
  EXPECT_EQ(run(1), plain);
  EXPECT_EQ(run(2), plain);
}

// pipe.to(device) turns group offloading off (no more switches between groups, the same image); a device this
// build has no backend for is refused by name, by to() and by enable_model_cpu_offload().
TEST(PipelineTo, CpuKeepsEverythingResidentAndDevicesWithoutTheirPluginAreRefused) {
  OffloadScope scope;
  auto pipe =
      FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev-bf16"), {.dtype = bfloat16});
  const std::vector<uint8_t> plain = pipe(tiny_flux_call(3)).images[0].pixels;
  pipe.enable_group_offload({.blocks_per_group = 1});
  EXPECT_EQ(pipe(tiny_flux_call(3)).images[0].pixels, plain);
  EXPECT_GT(pipe.context().memory().weight_group_stats().switches, 0);
  pipe.to(cpu);
  EXPECT_FALSE(pipe.model_cpu_offload_enabled());
  EXPECT_EQ(pipe.context().memory().weight_group_stats().groups, 0) << "no groups registered after to(cpu)";
  EXPECT_EQ(pipe(tiny_flux_call(3)).images[0].pixels, plain);
  // cuda runs through its PJRT plugin (tests/devices/pipelines_on_device_test.cpp runs whole pipelines on
  // xla-cpu): without the plugin, this machine's case, the error names the device; with it, the pipeline
  // moves there and back.
  try {
    pipe.to(Device("cuda"));
    EXPECT_EQ(pipe.device(), Device("cuda"));
    pipe.to(cpu);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
  // Model offload computes on the cpu only for now, whatever is installed.
  try {
    pipe.enable_model_cpu_offload(Device("cuda:1"));
    ADD_FAILURE() << "model offload onto cuda:1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
  pipe.enable_model_cpu_offload();  // the device detected: the CPU
  EXPECT_TRUE(pipe.model_cpu_offload_enabled());
  EXPECT_EQ(default_compute_device(), cpu);
  EXPECT_EQ(pipe(tiny_flux_call(3)).images[0].pixels, plain);
}

}  // namespace
}  // namespace kiln
