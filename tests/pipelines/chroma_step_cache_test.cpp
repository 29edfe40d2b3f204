// Step caching on Chroma against diffusers 0.42.1's own hooks (tools/goldens/step_cache_chroma.py) on the
// tiny ChromaPipeline, prompts through its tiny T5: TaylorSeer on every attention (transformer_blocks.N.attn,
// single_transformer_blocks.N.attn) takes diffusers' decision at every transformer evaluation, its
// classifier-free guidance's negative call in the "uncond" context, with its defaults, a non-default config
// and in bfloat16; Pyramid Attention Broadcast and FasterCache compute or reuse each attention as diffusers'
// hooks do (without guidance); the images are diffusers': float32 within one 8-bit level on 99% of their
// values, bfloat16 within a mean of 2 levels. First Block Cache and MagCache, which diffusers cannot run on
// Chroma (its blocks are not in the hook registry), are refused by name, as are PAB and FasterCache with
// guidance; compiled blocks refuse the attention caches, as compile mode does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kiln/families/chroma/chroma_pipeline.h"
#include "kiln/families/chroma/chroma_transformer.h"
#include "kiln/models/flux_transformer.h"
#include "support/pipeline_comparison.h"
#include "support/step_cache_goldens.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct ChromaCacheCase : testing::StepCacheCase {
  explicit ChromaCacheCase(const std::string& name) : StepCacheCase("step_cache_chroma", name) {}
};

using testing::Decisions;
using testing::decisions_of;
using testing::golden_decisions;

// float32: within one 8-bit level of diffusers' image on at least 99% of its values (and printed: at most how
// far); bfloat16: a mean difference of at most 2 levels. The image's text names the cache and the cond steps
// (from 1) whose first attention was reused.
void expect_image_matches(const PipelineOutput& out, const ChromaCacheCase& g) {
  ASSERT_EQ(out.images.size(), 1u) << g.name;
  if (g.bf16()) {
    const double mean = testing::mean_level_difference(out.images[0].pixels, g["image_u8"]);
    std::printf("[ levels   ] %s: mean %.3f vs diffusers\n", g.name.c_str(), mean);
    EXPECT_LE(mean, 2.0) << g.name;
  } else {
    const double share = testing::share_within_one_level(out.images[0].pixels, g["image_u8"]);
    std::printf("[ levels   ] %s: %.4f within one level, at most %d vs diffusers\n", g.name.c_str(), share,
                testing::max_level_difference(out.images[0], g["image_u8"]));
    EXPECT_GE(share, 0.99) << g.name;
  }
  EXPECT_EQ(out.images[0].metadata.at("cache"), step_cache_spec(parse_step_cache(g.meta("cache"))));
  const std::string reused = testing::golden_reused_steps(g);
  ASSERT_FALSE(reused.empty()) << g.name << ": the golden reuses nothing";
  EXPECT_EQ(out.images[0].metadata.at("cache_reused").substr(0, reused.size()), reused) << g.name;
}

// The call with the golden's cache; the latents after the first and the last step checked against diffusers'.
PipelineOutput run_checking_latents(DiffusionPipeline& pipe, const ChromaCacheCase& g) {
  // TaylorSeer's default factors are bfloat16: a factor rounded one way here and the other in diffusers now
  // and then, which guidance (scale 4) amplifies, leaves the guided float32 call's latents 5e-4 from
  // diffusers' at the end (its image within one level everywhere); with float32 factors
  // (taylor_cfg_f32_64x64_s106) they agree within 2e-4. A bfloat16 model with guidance ends 4.3e-2 from
  // diffusers' (its image 1.2 levels).
  const bool guided = g.has("guidance_scale") && std::stod(g.meta("guidance_scale")) > 1.0;
  const bool bf16_factors =
      g.meta("cache").rfind("taylorseer", 0) == 0 && g.meta("cache").find("factors=f32") == std::string::npos;
  const double tolerance = g.bf16() ? (guided ? 6e-2 : 3e-2) : (guided && bf16_factors ? 1e-3 : 2e-4);
  return testing::run_checking_latents(pipe, g, tolerance);
}

// TaylorSeer on every attention: diffusers' schedule and its image, with its defaults and classifier-free
// guidance (the negative call's attentions forecast from their own "uncond" history), with float32 factors
// and a cool-down with guidance, with float32 factors of order 2 and interval 3 without guidance, and in
// bfloat16 with guidance.
class ChromaTaylorSeer : public ::testing::TestWithParam<const char*> {};

TEST_P(ChromaTaylorSeer, ForecastsAsDiffusersDoesAndGivesItsImage) {
  const ChromaCacheCase g(GetParam());
  const auto pipe = g.load();
  const PipelineOutput out = run_checking_latents(*pipe, g);
  EXPECT_EQ(decisions_of(*pipe->denoiser().step_cache()), golden_decisions(g));
  expect_image_matches(out, g);
}

INSTANTIATE_TEST_SUITE_P(Goldens, ChromaTaylorSeer,
                         ::testing::Values("taylor_cfg_64x64_s101", "taylor_i3_o2_64x64_s102",
                                           "taylor_cfg_f32_64x64_s106", "taylor_bf16_cfg_64x64_s105"));

// The forecast is what makes TaylorSeer's image: without it (every attention computed at every step) the
// latents are others, ten times beyond the cached call's agreement with diffusers (2e-4) and more.
TEST(ChromaTaylorSeer, TheAttentionsAreForecast) {
  for (const char* name : {"taylor_cfg_64x64_s101", "taylor_i3_o2_64x64_s102"}) {
    const ChromaCacheCase g(name);
    const auto pipe = g.load();
    EXPECT_GT(testing::uncached_latents_distance(*pipe, g), 2e-3) << name;
  }
}

// Pyramid Attention Broadcast and FasterCache (guidance-distilled) on every attention, without guidance: at
// each evaluation each attention computes or reuses (PAB: its last output; FasterCache: its extrapolation) as
// diffusers' hooks did, by the scheduler's timestep, and the image is diffusers'.
class ChromaAttentionCache : public ::testing::TestWithParam<const char*> {};

TEST_P(ChromaAttentionCache, ComputesAndReusesAsDiffusersDoesAndGivesItsImage) {
  const ChromaCacheCase g(GetParam());
  const auto pipe = g.load();
  const PipelineOutput out = run_checking_latents(*pipe, g);
  const nn::StepCache& cache = *pipe->denoiser().step_cache();
  EXPECT_EQ(decisions_of(cache), golden_decisions(g));
  ASSERT_EQ(g["modules_computed"].size(1), 4) << g.name << ": chroma-tiny has 2 + 2 attentions";
  testing::expect_attentions_computed(cache.decisions(), g);
  expect_image_matches(out, g);
}

INSTANTIATE_TEST_SUITE_P(Goldens, ChromaAttentionCache,
                         ::testing::Values("pab_64x64_s103", "faster_w03_64x64_s104"));

// The refusal a call with `request` meets before any step: field "cache", its message holding every one of
// `words`; no step ran and the step cache decided nothing.
void expect_refused_before_any_step(DiffusionPipeline& pipe, PipelineRequest request,
                                    std::initializer_list<const char*> words, const std::string& how) {
  int steps = 0;
  request.callback_on_step_end = [&](StepState&) { ++steps; };
  try {
    pipe(request);
    ADD_FAILURE() << how << ": ran";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "cache") << how;
    for (const char* w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << how << ": " << e.what();
  }
  EXPECT_EQ(steps, 0) << how;
  EXPECT_TRUE(pipe.denoiser().step_cache()->decisions().empty()) << how;
}

// diffusers 0.42.1 cannot run First Block Cache or MagCache on Chroma (enable_cache fails: Chroma's blocks
// are not in its hook registry): Kiln refuses both by name, asked for by the call or enabled on the
// transformer, naming the caches that do run, before any step. The call's own cache overrides the enabled
// one.
TEST(ChromaStepCache, FirstBlockCacheAndMagCacheAreRefusedByName) {
  const ChromaCacheCase g("taylor_i3_o2_64x64_s102");
  const auto pipe = g.load();
  const std::initializer_list<const char*> names = {"not registered", "taylorseer", "pab", "fastercache"};
  for (const char* spec : {"fbcache:0.1", "magcache:0.1:ratios=1.0,1.0,1.0", "magcache:calibrate"}) {
    PipelineRequest asked = g.request();
    asked.cache = spec;
    expect_refused_before_any_step(*pipe, asked, names, spec);
  }
  PipelineRequest fb = g.request();
  fb.cache = "fbcache:0.1";
  expect_refused_before_any_step(*pipe, fb, {"First Block Cache does not run on Chroma"}, "fbcache's name");
  PipelineRequest mag = g.request();
  mag.cache = "magcache:calibrate";
  expect_refused_before_any_step(*pipe, mag, {"MagCache does not run on Chroma"}, "magcache's name");

  pipe->denoiser().enable_cache(FirstBlockCacheConfig{.threshold = 0.1});
  expect_refused_before_any_step(*pipe, g.request(), names, "enable_cache");
  PipelineRequest none = g.request();
  none.cache = "none";
  EXPECT_NO_THROW((*pipe)(none));
  EXPECT_FALSE(pipe->denoiser().step_cache()->active().has_value());
  EXPECT_NO_THROW((*pipe)(g.cached_request()));
  EXPECT_EQ(decisions_of(*pipe->denoiser().step_cache()), golden_decisions(g));
}

// The transformer itself refuses them too, called with one of them in effect outside the pipeline's checks.
TEST(ChromaStepCache, TheTransformerRefusesTheBlockCaches) {
  const ChromaCacheCase g("taylor_i3_o2_64x64_s102");
  const auto pipe = g.load();
  const auto& transformer = dynamic_cast<ChromaPipeline&>(*pipe).transformer();
  nn::StepCache& cache = *transformer.step_cache();
  const Tensor hidden = Tensor::zeros({1, 16, 64}, float32), text = Tensor::zeros({1, 5, 32}, float32);
  const Tensor t = Tensor::full({1}, 0.5, float32);
  const Tensor txt_ids = models::flux_text_ids(5, float32), img_ids = models::flux_latent_image_ids(4, 4);
  EXPECT_NO_THROW(transformer.forward(hidden, text, t, txt_ids, img_ids, Tensor()));
  for (const StepCacheConfig& config :
       {StepCacheConfig(FirstBlockCacheConfig{}), StepCacheConfig(MagCacheConfig{})}) {
    cache.reset(config, 4);
    try {
      transformer.forward(hidden, text, t, txt_ids, img_ids, Tensor());
      ADD_FAILURE() << step_cache_spec(config) << " ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("does not run on Chroma"), std::string::npos) << e.what();
    }
  }
  cache.reset(std::nullopt, 0);
}

// Chroma's classifier-free guidance (guidance_scale > 1) evaluates the negative prompt in calls of its own,
// and PAB and FasterCache keep one state per attention for both (diffusers' hooks mix the two branches):
// refused by name before any step; the same call without guidance runs, and TaylorSeer (a state per context)
// runs with it.
TEST(ChromaAttentionCache, GuidanceIsRefusedByName) {
  const ChromaCacheCase g("taylor_cfg_64x64_s101");
  const auto pipe = g.load();
  ASSERT_GT(g.request().guidance_scale.value_or(0.0f), 1.0f);
  for (const char* spec : {"pab", "fastercache"}) {
    PipelineRequest request = g.request();
    request.cache = spec;
    expect_refused_before_any_step(*pipe, request, {"Chroma", "guidance_scale 1"}, spec);
  }
  PipelineRequest unguided = g.request();
  unguided.cache = "pab";
  unguided.guidance_scale = 1.0f;
  unguided.num_inference_steps = 4;
  EXPECT_NO_THROW((*pipe)(unguided));
  EXPECT_EQ(pipe->denoiser().step_cache()->decisions().size(), 4u);
}

// Compiled blocks and compile mode refuse the attention caches (they work inside a block), naming the eager
// modes; fused eager runs TaylorSeer with diffusers' decisions and image.
TEST(ChromaStepCache, ExecutionModes) {
  const ChromaCacheCase taylor("taylor_i3_o2_64x64_s102"), pab("pab_64x64_s103");
  const auto blocks = taylor.load();
  blocks->configure({.mode = ExecutionMode::CompileBlocks});
  for (const char* spec : {"taylorseer", "pab", "fastercache"}) {
    PipelineRequest request = taylor.request();
    request.cache = spec;
    request.guidance_scale = 1.0f;
    expect_refused_before_any_step(*blocks, request, {"eager modes"}, std::string("compile-blocks ") + spec);
  }
  const auto compiled = pab.load();
  compiled->configure({.mode = ExecutionMode::Compile});
  expect_refused_before_any_step(*compiled, pab.cached_request(),
                                 {"Pyramid Attention Broadcast", "eager modes"}, "compile");

  const auto fused = taylor.load();
  fused->configure({.mode = ExecutionMode::Fuse});
  const PipelineOutput forecast = (*fused)(taylor.cached_request());
  EXPECT_EQ(decisions_of(*fused->denoiser().step_cache()), golden_decisions(taylor));
  EXPECT_GE(testing::share_within_one_level(forecast.images[0].pixels, taylor["image_u8"]), 0.99);
}

}  // namespace
}  // namespace kiln
