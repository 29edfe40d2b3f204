// LoRA adapters in every execution mode and under offload: the diffusers goldens in deferred-and-fused,
// compiled and compiled-blocks modes; switching adapters or their weights never recompiles (the adapters are
// inputs of the compiled programs); a pipeline with no active adapter runs exactly the plain path; unfuse
// restores every weight bit for bit; model and group offload give the unbudgeted image.
#include <gtest/gtest.h>

#include <map>

#include "kiln/nn/layers.h"
#include "kiln/runtime/counters.h"
#include "lora/lora_goldens.h"

namespace kiln {
namespace {

using testing::LoraGolden;

const ExecutionMode kModes[] = {ExecutionMode::Fuse, ExecutionMode::Compile, ExecutionMode::CompileBlocks};

std::vector<uint8_t> run_in(ExecutionMode mode, const LoraGolden& g) {
  auto pipe = g.load();
  g.replay(*pipe);
  pipe->configure({.mode = mode});
  return (*pipe)(g.request()).images[0].pixels;
}

TEST(LoraModes, Float32GoldensMatchDiffusersInEveryMode) {
  for (const char* name :
       {"flux_two_adapters", "flux_two_adapters_fused", "sd3_two_adapters_fused", "flux2_bfl"}) {
    const LoraGolden g(name);
    for (ExecutionMode mode : kModes) {
      SCOPED_TRACE(std::string(name) + " " + execution_mode_name(mode));
      EXPECT_GE(testing::share_within_one_level(run_in(mode, g), g.image()), 0.99);
    }
  }
}

TEST(LoraModes, Bfloat16AndGgufGoldensMatchDiffusersInEveryMode) {
  for (const char* name : {"fluxbf16_two_adapters", "fluxbf16_two_adapters_fused", "fluxq8_two_adapters"}) {
    const LoraGolden g(name);
    // The fused modes round once where the chains round several times (execution_modes_pipeline_test.cpp).
    for (ExecutionMode mode : kModes)
      EXPECT_LE(testing::mean_level_difference(run_in(mode, g), g.image()), 2.5)
          << name << " " << execution_mode_name(mode);
  }
}

// The number of programs compiled by `run` (kiln::counters()).
template <class Run>
int64_t programs_compiled_by(Run&& run) {
  const int64_t before = counters().graphs_compiled;
  run();
  return counters().graphs_compiled - before;
}

TEST(LoraModes, SwitchingAdaptersAndWeightsNeverRecompiles) {
  for (ExecutionMode mode : {ExecutionMode::Compile, ExecutionMode::CompileBlocks}) {
    const LoraGolden g("flux_two_adapters");
    auto pipe = g.load();
    g.replay(*pipe);  // style (diffusers layout) and detail (kohya) at 0.8 and -0.6
    // The same file twice: two adapters of equal ranks, so that switching between them keeps every shape.
    pipe->load_lora_weights(testing::data_path("lora/flux_kohya.safetensors"),
                            {.adapter_name = "detail_copy"});
    pipe->configure({.mode = mode});
    pipe->set_adapters({"style", "detail"}, {0.8, -0.6});
    std::vector<uint8_t> first;
    EXPECT_GT(programs_compiled_by([&] { first = (*pipe)(g.request()).images[0].pixels; }), 0);
    EXPECT_GE(testing::share_within_one_level(first, g.image()), 0.99) << execution_mode_name(mode);

    // New weights: the same programs, another image.
    pipe->set_adapters({"style", "detail"}, {0.2, 1.1});
    std::vector<uint8_t> reweighted;
    EXPECT_EQ(programs_compiled_by([&] { reweighted = (*pipe)(g.request()).images[0].pixels; }), 0);
    EXPECT_GT(testing::mean_level_difference(reweighted, g.image()), 1.0);

    // Another adapter of the same ranks in place of one: still no program built.
    pipe->set_adapters({"style", "detail_copy"}, {0.2, 1.1});
    std::vector<uint8_t> swapped;
    EXPECT_EQ(programs_compiled_by([&] { swapped = (*pipe)(g.request()).images[0].pixels; }), 0);
    EXPECT_EQ(swapped, reweighted) << "detail_copy holds the same tensors as detail";

    // And back to the first setting: the first image again, from the same programs.
    pipe->set_adapters({"style", "detail"}, {0.8, -0.6});
    std::vector<uint8_t> again;
    EXPECT_EQ(programs_compiled_by([&] { again = (*pipe)(g.request()).images[0].pixels; }), 0);
    EXPECT_EQ(again, first) << execution_mode_name(mode);
  }
}

TEST(LoraModes, NoActiveAdapterIsThePlainPathBitForBit) {
  const LoraGolden g("flux_none");
  const auto plain = (*g.load())(g.request()).images[0].pixels;
  auto pipe = g.load();
  pipe->load_lora_weights(testing::data_path("lora/flux_diffusers.safetensors"), {.adapter_name = "a"});
  pipe->set_adapters({});
  EXPECT_EQ((*pipe)(g.request()).images[0].pixels, plain);
  pipe->set_adapters({"a"});
  EXPECT_NE((*pipe)(g.request()).images[0].pixels, plain);
  pipe->unload_lora_weights();
  EXPECT_TRUE(pipe->get_list_adapters().empty());
  EXPECT_EQ((*pipe)(g.request()).images[0].pixels, plain);
}

// Every parameter of the components, as (name, tensor): the tensors share the weights' storage.
std::map<std::string, Tensor> parameters_of(DiffusionPipeline& pipe) {
  std::map<std::string, Tensor> out;
  for (const auto& [component, module] : pipe.components())
    if (module != nullptr)
      for (const auto& [name, slot] : module->named_parameters(component + ".")) out[name] = *slot;
  return out;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

TEST(LoraModes, UnfuseRestoresEveryWeightBitForBit) {
  for (const char* name :
       {"flux_two_adapters", "fluxbf16_two_adapters", "fluxq8_two_adapters", "sd3_diffusers"}) {
    const LoraGolden g(name);
    auto pipe = g.load();
    const std::map<std::string, Tensor> before = parameters_of(*pipe);
    g.replay(*pipe);
    pipe->fuse_lora({.lora_scale = 0.7});
    int changed = 0;
    for (const auto& [param, t] : parameters_of(*pipe)) changed += !bitwise_equal(t, before.at(param));
    EXPECT_GT(changed, 10) << name << ": fusing changes the adapted weights";
    pipe->unfuse_lora();
    for (const auto& [param, t] : parameters_of(*pipe)) {
      EXPECT_TRUE(bitwise_equal(t, before.at(param))) << name << ": " << param;
      // The very tensor, not a copy: a memory-mapped or quantized weight stays as it was loaded.
      EXPECT_EQ(t.storage(), before.at(param).storage()) << name << ": " << param;
    }
  }
}

TEST(LoraModes, OffloadGivesTheUnbudgetedImage) {
  const LoraGolden g("flux_two_adapters");
  auto run = [&](const ExecutionOptions& options, bool fuse) {
    auto pipe = g.load();
    g.replay(*pipe);
    if (fuse) pipe->fuse_lora({.lora_scale = 0.7});
    pipe->configure(options);
    return (*pipe)(g.request()).images[0].pixels;
  };
  for (bool fuse : {false, true}) {
    const auto plain = run({}, fuse);
    EXPECT_EQ(run({.offload = OffloadMode::Model}, fuse), plain) << "fused " << fuse;
    EXPECT_EQ(run({.offload = OffloadMode::Group, .blocks_per_group = 1}, fuse), plain) << "fused " << fuse;
    EXPECT_EQ(run({.offload = OffloadMode::Sequential}, fuse), plain) << "fused " << fuse;
  }
}

}  // namespace
}  // namespace kiln
