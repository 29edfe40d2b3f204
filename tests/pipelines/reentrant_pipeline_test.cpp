// One engine, many callers: pipelines found by class name, calls from several threads, pipelines with
// different modes and budgets side by side, cancellation, callbacks that change the latents or stop, and no
// memory growth over many calls. Every image is compared with the one the same request gives alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "io/io_test_util.h"
#include "kiln/core/device_runtime.h"
#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/families/flux2/flux2_pipeline.h"
#include "kiln/families/sd3/sd3_pipeline.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

std::string tiny_flux() {
  return testing::data_path("models/flux-tiny-dev-bf16");
}

PipelineRequest request(uint64_t seed, int steps = 2) {
  return {.prompt = "a red circle",
          .height = 32,
          .width = 32,
          .num_inference_steps = steps,
          .guidance_scale = 3.5f,
          .generator = Generator(seed),
          .max_sequence_length = 16};
}

std::unique_ptr<DiffusionPipeline> load(const std::string& model, DType dtype = bfloat16) {
  return DiffusionPipeline::from_pretrained(model, {.dtype = dtype});
}

std::vector<uint8_t> pixels(DiffusionPipeline& pipe, const PipelineRequest& r) {
  return pipe(r).images.at(0).pixels;
}

// Runs `body(i)` on `n` threads at once and waits for them; an exception in a thread fails the test.
void on_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      ++ready;
      while (ready.load() < n) std::this_thread::yield();  // start together, so the calls overlap
      try {
        body(i);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << i << ": " << e.what();
      }
    });
  for (std::thread& t : threads) t.join();
}

TEST(PipelineRegistry, FromPretrainedPicksTheClassOfModelIndex) {
  for (const auto& [folder, cls] : {std::pair{"models/flux-tiny-dev", "FluxPipeline"},
                                    {"models/sd3-tiny-medium", "StableDiffusion3Pipeline"},
                                    {"models/flux2-tiny-dev-full", "Flux2Pipeline"},
                                    {"models/flux2-tiny-klein-full", "Flux2KleinPipeline"}}) {
    const auto pipe = DiffusionPipeline::from_pretrained(testing::data_path(folder));
    EXPECT_STREQ(pipe->class_name(), cls);
    EXPECT_NE(dynamic_cast<DiffusionPipeline*>(pipe.get()), nullptr);
  }
  // Every registered class once, sorted by name (how errors list them); those of the first families among
  // them.
  std::vector<std::string> names;
  for (const PipelineClass* c : pipeline_classes()) names.push_back(c->name);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
  for (const char* name :
       {"Flux2KleinPipeline", "Flux2Pipeline", "FluxFillPipeline", "FluxImg2ImgPipeline",
        "FluxInpaintPipeline", "FluxKontextPipeline", "FluxPipeline", "StableDiffusion3Img2ImgPipeline",
        "StableDiffusion3InpaintPipeline", "StableDiffusion3Pipeline"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  const std::string refused =
      testing::error_message([] { pipeline_class("QwenImageLayeredPipeline", "x/model_index.json"); });
  EXPECT_NE(refused.find("pipeline class 'QwenImageLayeredPipeline' is not supported (Kiln runs " +
                         names.front() + ", "),
            std::string::npos)
      << refused;
}

// A field a pipeline does not take is refused by name, before anything runs.
TEST(PipelineRequest, RefusedFieldsAreNamed) {
  const auto expect_field = [](const std::function<void()>& f, const std::string& field) {
    try {
      f();
      ADD_FAILURE() << "no error for " << field;
    } catch (const RequestError& e) {
      EXPECT_EQ(e.field(), field) << e.what();
    }
  };
  PipelineRequest r = request(1);
  r.negative_prompt_3 = "blurry";
  expect_field([&] { pipeline_class("FluxPipeline", "").check_fields(r); }, "negative_prompt_3");
  r = request(1);
  r.true_cfg_scale = 2.0f;
  expect_field([&] { pipeline_class("StableDiffusion3Pipeline", "").check_fields(r); }, "true_cfg_scale");
  r = request(1);
  r.image.resize(1);
  expect_field([&] { pipeline_class("StableDiffusion3Pipeline", "").check_fields(r); }, "image");
  r = request(1);
  r.prompt_2 = "a square";
  expect_field([&] { pipeline_class("Flux2KleinPipeline", "").check_fields(r); }, "prompt_2");
  r = request(1);
  r.strength = 0.5f;
  expect_field([&] { pipeline_class("FluxPipeline", "").check_fields(r); }, "strength");
  auto pipe = load(tiny_flux());
  r = request(1);
  r.height = 40;
  expect_field([&] { (*pipe)(r); }, "height");
  r = request(1);
  r.num_inference_steps = 0;
  expect_field([&] { (*pipe)(r); }, "num_inference_steps");
}

// The same pipeline called from 4 threads with 4 seeds gives each thread the image its request gives alone,
// in every execution mode.
TEST(ReentrantPipeline, FourThreadsGetTheirSingleRunImagesInEveryMode) {
  for (const ExecutionMode mode :
       {ExecutionMode::Eager, ExecutionMode::Fuse, ExecutionMode::Compile, ExecutionMode::CompileBlocks}) {
    SCOPED_TRACE(execution_mode_name(mode));
    auto pipe = load(tiny_flux());
    pipe->configure({.mode = mode});
    std::vector<std::vector<uint8_t>> alone(4);
    for (int i = 0; i < 4; ++i) alone[i] = pixels(*pipe, request(100 + i));
    EXPECT_NE(alone[0], alone[1]) << "the seeds must give different images for the test to mean anything";
    std::vector<std::vector<uint8_t>> together(4);
    on_threads(4, [&](int i) { together[i] = pixels(*pipe, request(100 + i)); });
    for (int i = 0; i < 4; ++i) EXPECT_EQ(together[i], alone[i]) << "thread " << i;
  }
}

// Two pipelines in one process, one compiled under a 2 GiB budget and one eager with no budget, each in a
// context of its own: run side by side on two threads, each gives its single-run images, and neither's
// settings reach the other.
TEST(ReentrantPipeline, TwoPipelinesWithTheirOwnModesAndBudgetsRunSideBySide) {
  auto compiled = load(tiny_flux());
  auto eager = load(testing::data_path("models/sd3-tiny-medium"), float32);
  compiled->configure({.mode = ExecutionMode::Compile, .max_memory = int64_t{2} << 30});
  eager->configure({.mode = ExecutionMode::Eager});
  EXPECT_NE(&compiled->context(), &eager->context());
  EXPECT_EQ(eager->context().eager_mode_setting(), EagerMode::DeferNever);
  EXPECT_FALSE(compiled->context().eager_mode_setting().has_value()) << "the transformer is compiled instead";
  EXPECT_FALSE(eager->context().memory().resident_weight_budget().has_value());
  EXPECT_FALSE(ExecutionContext::default_context().memory().packed_weight_budget().has_value() &&
               *ExecutionContext::default_context().memory().packed_weight_budget() == 0)
      << "a pipeline's offload settings leaked into the default context";

  const PipelineRequest sd3{.prompt = "a red sphere",
                            .height = 32,
                            .width = 32,
                            .num_inference_steps = 2,
                            .guidance_scale = 4.5f,
                            .generator = Generator(4),
                            .max_sequence_length = 16};
  const std::vector<uint8_t> flux_alone = pixels(*compiled, request(7));
  const std::vector<uint8_t> sd3_alone = pixels(*eager, sd3);
  std::vector<uint8_t> flux_together, sd3_together;
  on_threads(2, [&](int i) {
    for (int k = 0; k < 2; ++k) {
      if (i == 0)
        flux_together = pixels(*compiled, request(7));
      else
        sd3_together = pixels(*eager, sd3);
    }
  });
  EXPECT_EQ(flux_together, flux_alone);
  EXPECT_EQ(sd3_together, sd3_alone);
  EXPECT_GT(compiled->denoiser().compiled_program_count(), 0u);
}

// A call cancelled during its denoising loop stops at the next step boundary with Cancelled and no image,
// whether it is cancelled from its own callback or from another thread; the next call's image is the one it
// gives alone.
TEST(ReentrantPipeline, CancelStopsWithinAStepAndTheNextCallIsUnchanged) {
  auto pipe = load(tiny_flux());
  const std::vector<uint8_t> alone = pixels(*pipe, request(9, 6));
  PipelineRequest r = request(9, 6);
  int steps_run = 0;
  r.callback_on_step_end = [&](StepState& s) {
    ++steps_run;
    if (s.step == 1) r.cancel.cancel();
  };
  try {
    (*pipe)(r);
    ADD_FAILURE() << "the cancelled call returned";
  } catch (const Cancelled& e) {
    EXPECT_NE(std::string(e.what()).find("cancelled after denoising step 2 of 6"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(steps_run, 2) << "no step may run after the one that cancelled";
  EXPECT_EQ(pixels(*pipe, request(9, 6)), alone);

  // From another thread, while the call waits for its turn behind a running one.
  PipelineRequest waiting = request(9, 6);
  PipelineRequest first = request(10, 6);
  std::atomic<bool> first_started{false};
  first.callback_on_step_end = [&](StepState&) { first_started = true; };
  std::thread t([&] { pixels(*pipe, first); });
  while (!first_started) std::this_thread::yield();
  waiting.cancel.cancel();
  EXPECT_THROW((*pipe)(waiting), Cancelled);
  t.join();
  EXPECT_EQ(pixels(*pipe, request(9, 6)), alone);
}

// callback_on_step_end may stop the loop (what was denoised so far is decoded) and replace the latents; the
// latents it returns must keep their shape.
TEST(ReentrantPipeline, StepCallbackMayStopOrChangeTheLatents) {
  auto pipe = load(tiny_flux());
  const std::vector<uint8_t> full = pixels(*pipe, request(3, 4));
  PipelineRequest stopped = request(3, 4);
  int calls = 0;
  stopped.callback_on_step_end = [&](StepState& s) {
    ++calls;
    s.stop = s.step == 1;
  };
  const std::vector<uint8_t> early = pixels(*pipe, stopped);
  EXPECT_EQ(calls, 2);
  EXPECT_NE(early, full);

  PipelineRequest same = request(3, 4);
  same.callback_on_step_end = [](StepState& s) { s.latents = s.latents.contiguous(); };
  EXPECT_EQ(pixels(*pipe, same), full) << "latents handed back unchanged keep the image";
  PipelineRequest zeroed = request(3, 4);
  zeroed.callback_on_step_end = [](StepState& s) {
    if (s.step == 2) s.latents = Tensor::zeros(s.latents.shape(), s.latents.dtype());
  };
  EXPECT_NE(pixels(*pipe, zeroed), full);
  PipelineRequest broken = request(3, 4);
  broken.callback_on_step_end = [](StepState& s) { s.latents = Tensor::zeros({1}, s.latents.dtype()); };
  EXPECT_THROW((*pipe)(broken), RequestError);
  EXPECT_EQ(pixels(*pipe, request(3, 4)), full) << "a failed call leaves the pipeline as it was";
}

// Memory after 100 calls equals memory after 1: nothing a call makes outlives it.
TEST(ReentrantPipeline, NoMemoryGrowthOverAHundredCalls) {
  auto pipe = load(tiny_flux());
  const PipelineRequest r = request(5, 1);
  const std::vector<uint8_t> first = pixels(*pipe, r);
  const int64_t after_one = memory_stats().current_bytes;
  const int64_t packed_after_one = pipe->context().memory().packed_weight_bytes();
  for (int i = 1; i < 100; ++i) ASSERT_EQ(pixels(*pipe, r), first) << "call " << i + 1;
  EXPECT_EQ(memory_stats().current_bytes, after_one);
  EXPECT_EQ(pipe->context().memory().packed_weight_bytes(), packed_after_one);
}

}  // namespace
}  // namespace kiln
