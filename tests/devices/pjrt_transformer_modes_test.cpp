// The tiny FLUX.1 transformer (tools/goldens/flux.py) on xla-cpu in the three execution modes: every mode
// gives diffusers' first-step output, and the executables per forward are what each mode promises — strict
// eager one per op call, deferred-and-fused a handful of regions, compiled one program (plus the ops outside
// it), and compile_repeated_blocks one executable per block class, shared by every block.
#include <gtest/gtest.h>

#include <memory>

#include "backends/pjrt/executable_cache.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/nn/module.h"
#include "kiln/runtime/counters.h"
#include "kiln/runtime/eager_mode.h"
#include "kiln/runtime/execution_context.h"
#include "support/golden_steps.h"
#include "support/pjrt_devices.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const Device xla0 = testing::test_device(0);

enum class Mode { Eager, Fuse, Compile, CompileBlocks };

struct Forward {
  Tensor out;
  int64_t executables = 0;  // executables launched by the forward
  int64_t built = 0;        // of which compiled now or loaded from the disk cache (not in memory before)
};

Forward forward_once(const models::FluxTransformer2DModel& model, const testing::FluxStepInputs& in,
                     Mode mode) {
  auto on = [](const Tensor& t) { return t.defined() ? t.to(xla0) : t; };
  const Tensor hidden = on(in.hidden), text = on(in.encoder_hidden), pooled = on(in.pooled),
               timestep = on(in.timestep), guidance = on(in.guidance), txt_ids = on(in.txt_ids),
               img_ids = on(in.img_ids);
  synchronize(xla0);
  const pjrt::ExecutableCacheStats before = pjrt::executable_cache_stats();
  Forward f;
  {
    EagerModeGuard guard(mode == Mode::Fuse ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
    f.out = model.forward(hidden, text, pooled, timestep, guidance, txt_ids, img_ids);
  }
  f.out = f.out.to(cpu);
  synchronize(xla0);
  const pjrt::ExecutableCacheStats after = pjrt::executable_cache_stats();
  f.built = after.compiles + after.disk_hits - before.compiles - before.disk_hits;
  f.executables = f.built + after.hits - before.hits;
  return f;
}

TEST(PjrtTransformerModes, EveryModeGivesDiffusersOutputWithItsExecutableCount) {
  KILN_SKIP_WITHOUT_PJRT();
  const testing::FluxStepInputs in = testing::flux_step0_inputs("schnell_cat_64x64_s0");
  int64_t eager_executables = 0;
  for (Mode mode : {Mode::Eager, Mode::Fuse, Mode::Compile, Mode::CompileBlocks}) {
    auto model =
        models::load_flux_transformer(testing::data_path("models/" + in.pipeline + "/transformer"), float32);
    model->to(xla0);
    if (mode == Mode::Compile) model->compile();
    if (mode == Mode::CompileBlocks) model->compile_repeated_blocks();
    const Forward first = forward_once(*model, in, mode);
    EXPECT_TRUE(testing::rel_max_error_within(first.out, in.expected, 1e-5)) << static_cast<int>(mode);
    // The second forward of the same shapes builds nothing and launches as many executables.
    const Forward second = forward_once(*model, in, mode);
    EXPECT_EQ(second.built, 0) << static_cast<int>(mode);
    EXPECT_EQ(second.executables, first.executables) << static_cast<int>(mode);
    switch (mode) {
      case Mode::Eager:
        eager_executables = first.executables;
        EXPECT_GT(eager_executables, 100) << "one per op call";
        break;
      case Mode::Fuse:
        // A region per flush (the repeat detector flushes at block boundaries): a few, not one per op.
        EXPECT_LE(first.executables, eager_executables / 20);
        break;
      case Mode::Compile:
        // The traced forward is one region; only what runs before call_compiled is outside it.
        EXPECT_LE(first.executables, 2);
        EXPECT_EQ(model->compiled_program_count(), 1u);
        break;
      case Mode::CompileBlocks:
        // One executable per block class (double-stream, single-stream), whatever the number of blocks; the
        // ops between blocks ran in strict eager before (already in memory).
        EXPECT_EQ(first.built, 2);
        break;
    }
  }
}

}  // namespace
}  // namespace kiln
