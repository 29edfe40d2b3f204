// The three execution modes on the tiny FLUX.1 transformers of tools/goldens/flux.py: strict eager,
// deferred-and-fused, compiled (whole forward) and compiled repeated blocks all give diffusers' output, and
// the compiled caches behave as the counters say: a seen shape compiles nothing, a new shape compiles once,
// compile_repeated_blocks builds one program per block class.
#include <gtest/gtest.h>

#include <optional>

#include "kiln/core/device_runtime.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/flux2_transformer.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/sd3_transformer.h"
#include "kiln/nn/module.h"
#include "kiln/ops.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/eager_mode.h"
#include "kiln/runtime/execution_context.h"
#include "support/golden_steps.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using models::FluxTransformer2DModel;

using StepInputs = testing::FluxStepInputs;
using testing::flux_step0_inputs;

Tensor run(const FluxTransformer2DModel& model, const StepInputs& in) {
  Tensor out = model.forward(in.hidden, in.encoder_hidden, in.pooled, in.timestep, in.guidance, in.txt_ids,
                             in.img_ids);
  synchronize();
  return out;
}

enum class Mode { Eager, Fuse, Compile, CompileBlocks };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Eager:
      return "eager";
    case Mode::Fuse:
      return "fuse";
    case Mode::Compile:
      return "compile";
    case Mode::CompileBlocks:
      return "compile_repeated_blocks";
  }
  return "?";
}

// The model's first-step output in `mode` (a fresh model each time: compiled state stays with it).
Tensor run_in_mode(Mode mode, const StepInputs& in, DType dtype) {
  auto model =
      models::load_flux_transformer(testing::data_path("models/" + in.pipeline + "/transformer"), dtype);
  if (mode == Mode::Compile) model->compile({.fullgraph = true, .dynamic = false});
  if (mode == Mode::CompileBlocks) model->compile_repeated_blocks();
  if (mode == Mode::Fuse) {
    EagerModeGuard fuse(EagerMode::DeferAndFuse);
    return run(*model, in);
  }
  return run(*model, in);
}

TEST(ExecutionModes, EveryModeMatchesEagerAndDiffusersInFloat32) {
  for (const char* golden : {"schnell_cat_64x64_s0", "dev_unicode_80x48_s1234"}) {
    const StepInputs in = flux_step0_inputs(golden);
    const Tensor eager = run_in_mode(Mode::Eager, in, float32);
    for (Mode mode : {Mode::Fuse, Mode::Compile, Mode::CompileBlocks}) {
      const Tensor out = run_in_mode(mode, in, float32);
      EXPECT_TRUE(testing::rel_max_error_within(out, eager, 1e-5)) << golden << " " << mode_name(mode);
      EXPECT_TRUE(testing::rel_max_error_within(out, in.expected, 1e-4)) << golden << " " << mode_name(mode);
    }
  }
}

TEST(ExecutionModes, EveryModeMatchesDiffusersInBfloat16) {
  const StepInputs in = flux_step0_inputs("devbf16_cat_64x64_s0");
  const Tensor eager = run_in_mode(Mode::Eager, in, bfloat16);
  for (Mode mode : {Mode::Fuse, Mode::Compile, Mode::CompileBlocks}) {
    const Tensor out = run_in_mode(mode, in, bfloat16);
    // The fused ops round once where eager rounds after every op (kiln/ops/fused.h), so bf16 results move
    // by bf16 ulps: the bound is eager's own bound against diffusers (flux_transformer_test.cpp: 1e-2,
    // measured 0.37%) doubled, since both sides now carry such roundings.
    EXPECT_TRUE(testing::rel_max_error_within(out, in.expected, 2e-2)) << mode_name(mode);
    EXPECT_TRUE(testing::rel_max_error_within(out, eager, 2e-2)) << mode_name(mode);
  }
}

TEST(ExecutionModes, CompiledForwardCompilesOncePerShape) {
  const StepInputs a = flux_step0_inputs("schnell_cat_64x64_s0");       // 64x64
  const StepInputs b = flux_step0_inputs("schnell_unicode_64x96_s42");  // 64x96: another shape
  auto model =
      models::load_flux_transformer(testing::data_path("models/" + a.pipeline + "/transformer"), float32);
  model->compile();
  reset_counters();
  const Tensor first = run(*model, a);
  EXPECT_EQ(counters().graphs_compiled, 1);
  EXPECT_EQ(counters().graph_cache_hits, 0);

  // Same shapes, another timestep (a later denoising step): nothing compiles, values follow the timestep.
  reset_counters();
  StepInputs later = a;
  later.timestep = mul(a.timestep, 0.5);
  const Tensor second = run(*model, later);
  EXPECT_EQ(counters().graphs_compiled, 0);
  EXPECT_EQ(counters().graph_cache_hits, 1);
  EXPECT_EQ(counters().kernels_compiled, 0);
  auto eager_model =
      models::load_flux_transformer(testing::data_path("models/" + a.pipeline + "/transformer"), float32);
  EXPECT_TRUE(testing::rel_max_error_within(second, run(*eager_model, later), 1e-5));

  // A new resolution compiles once; going back to the first compiles nothing.
  reset_counters();
  run(*model, b);
  EXPECT_EQ(counters().graphs_compiled, 1);
  reset_counters();
  EXPECT_TRUE(testing::rel_max_error_within(run(*model, a), first, 0.0));
  EXPECT_EQ(counters().graphs_compiled, 0);
  EXPECT_EQ(model->compiled_program_count(), 2u);
}

TEST(ExecutionModes, RepeatedBlocksShareOneProgramPerBlockClass) {
  const StepInputs in = flux_step0_inputs("dev_cat_64x64_s0");
  auto model =
      models::load_flux_transformer(testing::data_path("models/" + in.pipeline + "/transformer"), float32);
  const int64_t blocks = model->config().num_layers + model->config().num_single_layers;
  ASSERT_GE(model->config().num_layers, 2);
  ASSERT_GE(model->config().num_single_layers, 2);
  model->compile_repeated_blocks();
  reset_counters();
  run(*model, in);
  EXPECT_EQ(counters().graphs_compiled, 2);  // one double-stream, one single-stream program
  EXPECT_EQ(counters().graph_cache_hits, blocks - 2);
  reset_counters();
  run(*model, in);
  EXPECT_EQ(counters().graphs_compiled, 0);
  EXPECT_EQ(counters().graph_cache_hits, blocks);
}

TEST(ExecutionModes, CompiledRunsReuseIntermediateMemory) {
  const StepInputs in = flux_step0_inputs("schnell_long_96x64_s7");
  auto model =
      models::load_flux_transformer(testing::data_path("models/" + in.pipeline + "/transformer"), float32);
  reset_counters();
  { const Tensor out = run(*model, in); }
  const int64_t eager_peak = counters().memory_of(cpu).peak_bytes - memory_stats(cpu).current_bytes;
  model->compile();
  { const Tensor warm = run(*model, in); }
  reset_counters();
  { const Tensor out = run(*model, in); }
  const int64_t compiled_peak = counters().memory_of(cpu).peak_bytes - memory_stats(cpu).current_bytes;
  // The compiled program keeps every intermediate in one arena planned from liveness: here 72 KiB for 484 KiB
  // of intermediates, which is exactly the most bytes alive at once (KILN_LOG=compile). Eager frees each
  // tensor as soon as the code drops it and ends up with about the same live set on this tiny model; without
  // reuse the compiled run would need 6.5x that.
  EXPECT_GT(eager_peak, 0);
  EXPECT_LT(compiled_peak, eager_peak * 5 / 4);
}

// ---- SD3.5: the same modes on the tiny Medium-like (MMDiT-X, CFG batch 2) and Large-like transformers.

using Sd3Inputs = testing::Sd3StepInputs;
using testing::sd3_step0_inputs;

Tensor run_sd3(Mode mode, const Sd3Inputs& in, int64_t* programs = nullptr) {
  auto model =
      models::load_sd3_transformer(testing::data_path("models/" + in.pipeline + "/transformer"), float32);
  if (mode == Mode::Compile) model->compile();
  if (mode == Mode::CompileBlocks) model->compile_repeated_blocks();
  std::optional<EagerModeGuard> fuse;
  if (mode == Mode::Fuse) fuse.emplace(EagerMode::DeferAndFuse);
  reset_counters();
  Tensor out = model->forward(in.hidden, in.encoder_hidden, in.pooled, in.timestep);
  synchronize();
  if (programs) *programs = counters().graphs_compiled;
  return out;
}

TEST(ExecutionModes, Sd3EveryModeMatchesEagerAndDiffusers) {
  for (const char* name : {"medium_cat_64x64_s0", "large_unicode_80x48_s7"}) {
    const Sd3Inputs in = sd3_step0_inputs(name);
    const Tensor eager = run_sd3(Mode::Eager, in);
    for (Mode mode : {Mode::Fuse, Mode::Compile, Mode::CompileBlocks}) {
      int64_t programs = 0;
      const Tensor out = run_sd3(mode, in, &programs);
      EXPECT_TRUE(testing::rel_max_error_within(out, eager, 1e-5)) << name << " " << mode_name(mode);
      EXPECT_TRUE(testing::rel_max_error_within(out, in.expected, 1e-4)) << name << " " << mode_name(mode);
      // Blocks: 3 joint blocks of 2 structures (Medium: dual-attention x2 + the context_pre_only last one;
      // Large: plain x2 + the last one).
      if (mode == Mode::CompileBlocks) {
        EXPECT_EQ(programs, 2) << name;
      }
      if (mode == Mode::Compile) {
        EXPECT_EQ(programs, 1) << name;
      }
    }
  }
}

// ---- FLUX.2: the same modes on the tiny dev (guidance, reference images) and klein transformers.

Tensor run_flux2(Mode mode, const testing::Flux2StepInputs& in, DType dtype, int64_t* programs = nullptr) {
  auto model =
      models::load_flux2_transformer(testing::data_path("models/" + in.pipeline + "/transformer"), dtype);
  if (mode == Mode::Compile) model->compile({.fullgraph = true, .dynamic = false});
  if (mode == Mode::CompileBlocks) model->compile_repeated_blocks();
  std::optional<EagerModeGuard> fuse;
  if (mode == Mode::Fuse) fuse.emplace(EagerMode::DeferAndFuse);
  reset_counters();
  Tensor out = model->forward(in.hidden, in.encoder_hidden, in.timestep, in.guidance, in.txt_ids, in.img_ids);
  synchronize();
  if (programs) *programs = counters().graphs_compiled;
  return out;
}

TEST(ExecutionModes, Flux2EveryModeMatchesEagerAndDiffusers) {
  for (const char* golden : {"dev_ref1_64x48_s3", "klein_nocfg_48x80_s9"}) {
    const testing::Flux2StepInputs in = testing::flux2_step0_inputs(golden);
    const Tensor eager = run_flux2(Mode::Eager, in, float32);
    for (Mode mode : {Mode::Fuse, Mode::Compile, Mode::CompileBlocks}) {
      int64_t programs = 0;
      const Tensor out = run_flux2(mode, in, float32, &programs);
      EXPECT_TRUE(testing::rel_max_error_within(out, eager, 1e-5)) << golden << " " << mode_name(mode);
      EXPECT_TRUE(testing::rel_max_error_within(out, in.expected, 1e-4)) << golden << " " << mode_name(mode);
      // One program per block class (double-stream, single-stream), shared by the blocks of each class.
      if (mode == Mode::CompileBlocks) {
        EXPECT_EQ(programs, 2) << golden;
      }
      if (mode == Mode::Compile) {
        EXPECT_EQ(programs, 1) << golden;
      }
    }
  }
}

TEST(ExecutionModes, Flux2EveryModeMatchesDiffusersInBfloat16) {
  const testing::Flux2StepInputs in = testing::flux2_step0_inputs("devbf16_64x64_s0");
  const Tensor eager = run_flux2(Mode::Eager, in, bfloat16);
  for (Mode mode : {Mode::Fuse, Mode::Compile, Mode::CompileBlocks}) {
    // As for FLUX.1 above: the fused ops round once where eager rounds after every op.
    const Tensor out = run_flux2(mode, in, bfloat16);
    EXPECT_TRUE(testing::rel_max_error_within(out, in.expected, 2e-2)) << mode_name(mode);
    EXPECT_TRUE(testing::rel_max_error_within(out, eager, 2e-2)) << mode_name(mode);
  }
}

// A module whose forward reads a value on the host: compiling it must name the op that breaks the graph.
class HostReadingModule : public nn::Module {
 public:
  Tensor forward(const Tensor& x) const {
    return call_compiled({x}, [](const std::vector<Tensor>& in) {
      const Tensor s = sum(in[0]);
      return std::vector<Tensor>{mul(in[0], s.item())};
    })[0];
  }
  bool supports_compile() const override { return true; }
};

TEST(ExecutionModes, FullgraphRejectsHostReadsNamingTheOp) {
  HostReadingModule m;
  const Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  m.compile({.fullgraph = true});
  try {
    m.forward(x);
    FAIL() << "expected a graph-break error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("fullgraph"), std::string::npos) << what;
    EXPECT_NE(what.find("on the host"), std::string::npos) << what;
    EXPECT_NE(what.find("sum("), std::string::npos) << what;
  }
  // Without fullgraph the forward runs eagerly for those shapes, after a warning.
  m.compile({.fullgraph = false});
  EXPECT_EQ(m.forward(x).to_vector<float>(), (std::vector<float>{6, 12, 18}));
}

TEST(ExecutionModes, UnsupportedCompileRequestsAreErrors) {
  HostReadingModule m;
  EXPECT_THROW(m.compile({.fullgraph = true, .dynamic = true}), Error);
  EXPECT_THROW(m.compile_repeated_blocks(), Error);
  models::AutoencoderKL vae(models::AutoencoderKLConfig{});
  EXPECT_THROW(vae.compile(), Error);
}

}  // namespace
}  // namespace kiln
