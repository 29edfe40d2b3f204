// Step caching on FLUX.2 against diffusers 0.42.1's own hooks (tools/goldens/step_cache_flux2.py) on the tiny
// Flux2Pipeline and Flux2KleinPipeline, driven by prompt embeddings: MagCache (with the ratios its
// calibration measured: none are published for FLUX.2) and TaylorSeer (every attention,
// transformer_blocks.N.attn and single_transformer_blocks.N.attn) take diffusers' decision at every
// transformer evaluation (klein's guidance "uncond" context its own), with the error that decided it, with
// and without a reference image, and give diffusers' image: float32 within one 8-bit level on 99% of its
// values, bfloat16 within its noise; Pyramid Attention Broadcast and FasterCache compute or reuse each
// attention as diffusers' hooks do. First Block Cache, which diffusers cannot run on FLUX.2, and MagCache
// without ratios are refused by name. Compiled blocks take MagCache's decisions and give its image; they
// refuse TaylorSeer, and compile mode any cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kiln/families/flux2/flux2_pipeline.h"
#include "kiln/models/flux2_transformer.h"
#include "support/pipeline_comparison.h"
#include "support/step_cache_goldens.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct Flux2CacheCase : testing::StepCacheCase {
  explicit Flux2CacheCase(const std::string& name) : StepCacheCase("step_cache_flux2", name) {}
};

using testing::Decisions;
using testing::decisions_of;
using testing::golden_decisions;

// MagCache's accumulated error at each evaluation, -1 where diffusers measured none (a retained step).
void expect_changes_match(const nn::StepCache& cache, const Flux2CacheCase& g) {
  const std::vector<double> changes = g["change"].to_vector<double>();
  ASSERT_EQ(cache.decisions().size(), changes.size()) << g.name;
  for (size_t i = 0; i < changes.size(); ++i) {
    if (changes[i] < 0)
      EXPECT_EQ(cache.decisions()[i].change, -1) << g.name << " evaluation " << i;
    else
      EXPECT_NEAR(cache.decisions()[i].change, changes[i], 1e-5) << g.name << " evaluation " << i;
  }
}

// float32: within one 8-bit level of diffusers' image on at least 99% of its values (and printed: at most how
// far); bfloat16: a mean difference of at most 2 levels (the FLUX.2 pipeline tests' bound). The image's text
// names the cache and the cond steps (from 1) whose blocks were reused.
void expect_image_matches(const PipelineOutput& out, const Flux2CacheCase& g) {
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
  EXPECT_EQ(out.images[0].metadata.at("cache_reused").substr(0, reused.size()), reused) << g.name;
}

// The call with the golden's cache; the latents after the first and the last step checked against diffusers'.
PipelineOutput run_checking_latents(DiffusionPipeline& pipe, const Flux2CacheCase& g) {
  const double tolerance = g.bf16() ? 3e-2 : 2e-4;
  return testing::run_checking_latents(pipe, g, tolerance);
}

// MagCache with the ratios diffusers' calibration measured on each tiny model, and the calibrations
// themselves (klein's with guidance: the cond context's ratios).
class Flux2MagCache : public ::testing::TestWithParam<const char*> {};

TEST_P(Flux2MagCache, TakesDiffusersDecisionsAndGivesItsImage) {
  const Flux2CacheCase g(GetParam());
  const auto pipe = g.load();
  const PipelineOutput out = run_checking_latents(*pipe, g);
  const nn::StepCache& cache = *pipe->denoiser().step_cache();
  EXPECT_EQ(decisions_of(cache), golden_decisions(g));
  expect_changes_match(cache, g);
  expect_image_matches(out, g);
  if (g.file.contains("calibration_ratios")) {
    const std::vector<double> expected = g["calibration_ratios"].to_vector<double>();
    ASSERT_EQ(cache.calibrated_mag_ratios().size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_NEAR(cache.calibrated_mag_ratios()[i], expected[i], 1e-4) << "step " << i;
    EXPECT_EQ(out.images[0].metadata.count("mag_ratios"), 1u);
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, Flux2MagCache,
                         ::testing::Values("mag_calibrate_64x64_s71", "mag_64x64_s72", "mag_ref1_64x48_s74",
                                           "mag_klein_calibrate_cfg_64x64_s75", "mag_klein_cfg_64x64_s76"));

// Kiln's own calibration, given back as `ratios=` (what `kiln generate --cache magcache:calibrate` prints and
// the image's text keeps), takes the decisions diffusers took with its calibration's ratios.
TEST(Flux2MagCache, ItsOwnCalibrationGivesDiffusersDecisions) {
  const Flux2CacheCase calibration("mag_calibrate_64x64_s71"), cached("mag_64x64_s72");
  const auto pipe = calibration.load();
  const PipelineOutput measured = (*pipe)(calibration.cached_request());
  const std::string spec = cached.meta("cache");
  PipelineRequest request = cached.request();
  request.cache =
      spec.substr(0, spec.find(":ratios=")) + ":ratios=" + measured.images[0].metadata.at("mag_ratios");
  const PipelineOutput out = (*pipe)(request);
  EXPECT_EQ(decisions_of(*pipe->denoiser().step_cache()), golden_decisions(cached));
  EXPECT_GE(testing::share_within_one_level(out.images[0].pixels, cached["image_u8"]), 0.99);
}

// TaylorSeer on every attention: diffusers' schedule and its image, with its defaults, with float32 factors
// of order 2, a cool-down and klein's guidance, with a reference image, and in bfloat16.
class Flux2TaylorSeer : public ::testing::TestWithParam<const char*> {};

TEST_P(Flux2TaylorSeer, ForecastsAsDiffusersDoesAndGivesItsImage) {
  const Flux2CacheCase g(GetParam());
  const auto pipe = g.load();
  const PipelineOutput out = run_checking_latents(*pipe, g);
  EXPECT_EQ(decisions_of(*pipe->denoiser().step_cache()), golden_decisions(g));
  expect_image_matches(out, g);
}

INSTANTIATE_TEST_SUITE_P(Goldens, Flux2TaylorSeer,
                         ::testing::Values("taylor_64x64_s81", "taylor_klein_cfg_64x64_s82",
                                           "taylor_ref1_64x48_s84", "taylor_bf16_64x64_s83"));

// The forecast is what makes TaylorSeer's image: without it (every attention computed at every step) the
// latents are others, ten times beyond the cached call's agreement with diffusers (2e-4) and more.
TEST(Flux2TaylorSeer, TheAttentionsAreForecast) {
  for (const char* name : {"taylor_64x64_s81", "taylor_klein_cfg_64x64_s82"}) {
    const Flux2CacheCase g(name);
    const auto pipe = g.load();
    EXPECT_GT(testing::uncached_latents_distance(*pipe, g), 2e-3) << name;
  }
}

// Pyramid Attention Broadcast and FasterCache (guidance-distilled) on every attention: at each evaluation
// each attention computes or reuses (PAB: its last output; FasterCache: its extrapolation) as diffusers'
// hooks did, by the scheduler's timestep, with and without a reference image, and the image is diffusers'.
class Flux2AttentionCache : public ::testing::TestWithParam<const char*> {};

TEST_P(Flux2AttentionCache, ComputesAndReusesAsDiffusersDoesAndGivesItsImage) {
  const Flux2CacheCase g(GetParam());
  const auto pipe = g.load();
  const PipelineOutput out = run_checking_latents(*pipe, g);
  const nn::StepCache& cache = *pipe->denoiser().step_cache();
  EXPECT_EQ(decisions_of(cache), golden_decisions(g));
  testing::expect_attentions_computed(cache.decisions(), g);
  expect_image_matches(out, g);
}

INSTANTIATE_TEST_SUITE_P(Goldens, Flux2AttentionCache,
                         ::testing::Values("pab_64x64_s91", "pab_ref1_64x48_s92", "faster_w03_64x64_s95",
                                           "faster_bf16_64x64_s97"));

// klein's classifier-free guidance evaluates the negative prompt in calls of its own, and these caches keep
// one state per attention for both (diffusers' hooks mix the two branches): refused by name before any step;
// a call without that guidance runs.
TEST(Flux2AttentionCache, KleinGuidanceIsRefusedByName) {
  const Flux2CacheCase g("taylor_klein_cfg_64x64_s82");
  const auto pipe = g.load();
  for (const char* spec : {"pab", "fastercache"}) {
    PipelineRequest request = g.request();
    request.cache = spec;
    try {
      (*pipe)(request);
      ADD_FAILURE() << spec << " ran with klein's guidance";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.field(), "cache");
      EXPECT_NE(std::string(e.what()).find("klein"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(pipe->denoiser().step_cache()->decisions().empty()) << spec;
  }
  PipelineRequest unguided = g.request();
  unguided.cache = "pab";
  unguided.guidance_scale = 1.0f;
  EXPECT_NO_THROW((*pipe)(unguided));
  EXPECT_FALSE(pipe->denoiser().step_cache()->decisions().empty());
}

// diffusers 0.42.1 has no working First Block Cache on FLUX.2 (its single-stream blocks return one tensor its
// tail hook cannot take apart): Kiln refuses it by name, asked for by the call or enabled on the transformer,
// naming the caches that do run, before any step.
TEST(Flux2StepCache, FirstBlockCacheIsRefusedByName) {
  const Flux2CacheCase g("taylor_64x64_s81");
  const auto pipe = g.load();
  const auto expect_refused = [&](const PipelineRequest& request, const char* how) {
    try {
      (*pipe)(request);
      ADD_FAILURE() << "First Block Cache ran on FLUX.2 (" << how << ")";
    } catch (const RequestError& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.field(), "cache") << how;
      EXPECT_NE(what.find("diffusers 0.42.1 has no working First Block Cache for FLUX.2"), std::string::npos)
          << what;
      EXPECT_NE(what.find("magcache:calibrate"), std::string::npos) << what;
      EXPECT_NE(what.find("taylorseer"), std::string::npos) << what;
      EXPECT_NE(what.find("pab"), std::string::npos) << what;
    }
    EXPECT_TRUE(pipe->denoiser().step_cache()->decisions().empty()) << how;
  };
  PipelineRequest asked = g.request();
  asked.cache = "fbcache:0.1";
  expect_refused(asked, "the call's cache");
  pipe->denoiser().enable_cache(FirstBlockCacheConfig{.threshold = 0.1});
  expect_refused(g.request(), "enable_cache");
  // The call's own cache overrides the enabled one; "none" runs uncached.
  PipelineRequest none = g.request();
  none.cache = "none";
  EXPECT_NO_THROW((*pipe)(none));
  EXPECT_NO_THROW((*pipe)(g.cached_request()));
  EXPECT_EQ(decisions_of(*pipe->denoiser().step_cache()), golden_decisions(g));
}

// MagCache without ratios of its own would take the published ones, and none are published for FLUX.2
// (diffusers ships FLUX.1-dev's only, and refuses a config without ratios): refused naming the field and the
// way to measure them, before any work; the calibration itself runs.
TEST(Flux2MagCache, NoRatiosOfItsOwnIsRefused) {
  for (const char* name : {"mag_64x64_s72", "mag_klein_cfg_64x64_s76"}) {
    const Flux2CacheCase g(name);
    const auto pipe = g.load();
    EXPECT_TRUE(pipe->denoiser().step_cache()->published_mag_ratios().empty()) << name;
    PipelineRequest request = g.request();
    request.cache = "magcache:0.3";
    try {
      (*pipe)(request);
      ADD_FAILURE() << "MagCache ran on FLUX.2 without ratios (" << name << ")";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.field(), "cache");
      EXPECT_NE(std::string(e.what()).find("magcache:calibrate"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(pipe->denoiser().step_cache()->decisions().empty()) << name;
    request.cache = "magcache:calibrate";
    EXPECT_NO_THROW((*pipe)(request)) << name;
  }
}

// Compiled blocks take MagCache's decisions and give its image (the decision stays on the host, as on
// FLUX.1); they refuse TaylorSeer, which forecasts inside a block, and compile mode refuses any cache, naming
// compile-blocks. Deferred-and-fused eager runs TaylorSeer.
TEST(Flux2StepCache, ExecutionModes) {
  const Flux2CacheCase mag("mag_klein_cfg_64x64_s76"), taylor("taylor_64x64_s81");
  const auto blocks = mag.load();
  blocks->configure({.mode = ExecutionMode::CompileBlocks});
  const PipelineOutput out = (*blocks)(mag.cached_request());
  EXPECT_EQ(decisions_of(*blocks->denoiser().step_cache()), golden_decisions(mag));
  EXPECT_GE(testing::share_within_one_level(out.images[0].pixels, mag["image_u8"]), 0.99);
  const auto taylor_blocks = taylor.load();
  taylor_blocks->configure({.mode = ExecutionMode::CompileBlocks});
  try {
    (*taylor_blocks)(taylor.cached_request());
    ADD_FAILURE() << "compiled blocks ran TaylorSeer";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "cache");
    EXPECT_NE(std::string(e.what()).find("eager modes"), std::string::npos) << e.what();
  }

  const auto compiled = mag.load();
  compiled->configure({.mode = ExecutionMode::Compile});
  try {
    (*compiled)(mag.cached_request());
    ADD_FAILURE() << "compile mode ran a step cache";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "cache");
    EXPECT_NE(std::string(e.what()).find("compile-blocks"), std::string::npos) << e.what();
  }

  const auto fused = taylor.load();
  fused->configure({.mode = ExecutionMode::Fuse});
  const PipelineOutput forecast = (*fused)(taylor.cached_request());
  EXPECT_EQ(decisions_of(*fused->denoiser().step_cache()), golden_decisions(taylor));
  EXPECT_GE(testing::share_within_one_level(forecast.images[0].pixels, taylor["image_u8"]), 0.99);
}

}  // namespace
}  // namespace kiln
