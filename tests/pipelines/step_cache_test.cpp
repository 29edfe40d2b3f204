// Step caching against diffusers' own hooks (tools/goldens/step_cache.py): First Block Cache on the tiny
// FLUX.1 pipelines takes diffusers' decision at every transformer evaluation (true CFG's two contexts each
// their own), with the change that decided it, and gives diffusers' image: float32 within one 8-bit level,
// bfloat16 within its noise. The execution modes take the same decisions; compile mode refuses a cache by
// name.
#include <gtest/gtest.h>

#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/models/flux_transformer.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct CacheCase : testing::GoldenFile {
  explicit CacheCase(const std::string& name) : GoldenFile("step_cache", name) {}
  bool bf16() const { return meta("dtype") == "bfloat16"; }
  PipelineRequest cached_request() const {
    PipelineRequest r = request();
    r.cache = meta("cache");
    return r;
  }
};

// The decisions a call took, as the golden records them: context (0 cond, 1 uncond) and computed, per
// evaluation.
std::vector<std::pair<int64_t, int64_t>> decisions_of(const nn::StepCache& cache) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const nn::StepCache::Decision& d : cache.decisions())
    out.emplace_back(d.context == "cond" ? 0 : 1, d.computed ? 1 : 0);
  return out;
}

std::vector<std::pair<int64_t, int64_t>> golden_decisions(const CacheCase& g) {
  const std::vector<int64_t> context = g["context"].to_vector<int64_t>();
  const std::vector<int64_t> computed = g["computed"].to_vector<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t i = 0; i < context.size(); ++i) out.emplace_back(context[i], computed[i]);
  return out;
}

class FirstBlockCache : public ::testing::TestWithParam<const char*> {};

TEST_P(FirstBlockCache, TakesDiffusersDecisionsAndGivesItsImage) {
  const CacheCase g(GetParam());
  const auto pipe = g.load();
  PipelineRequest request = g.cached_request();
  std::vector<Tensor> steps;
  request.callback_on_step_end = [&](StepState& s) { steps.push_back(s.latents.contiguous()); };
  const PipelineOutput out = (*pipe)(request);
  const nn::StepCache& cache = *pipe->denoiser().step_cache();

  EXPECT_EQ(decisions_of(cache), golden_decisions(g));
  const std::vector<double> changes = g["change"].to_vector<double>();
  ASSERT_EQ(cache.decisions().size(), changes.size());
  for (size_t i = 0; i < changes.size(); ++i) {
    if (changes[i] < 0) {
      EXPECT_EQ(cache.decisions()[i].change, -1) << "evaluation " << i << ": a context's first";
    } else {
      EXPECT_NEAR(cache.decisions()[i].change, changes[i], g.bf16() ? 1e-2 : 1e-4) << "evaluation " << i;
    }
  }
  ASSERT_EQ(static_cast<int>(steps.size()), std::stoi(g.meta("steps_run")));
  const double tolerance = g.bf16() ? 3e-2 : 2e-4;
  EXPECT_TRUE(testing::rel_max_error_within(steps.front(), g["latents_step0"], tolerance));
  EXPECT_TRUE(testing::rel_max_error_within(steps.back(), g["latents_final"], tolerance));
  ASSERT_EQ(out.images.size(), 1u);
  if (g.bf16())
    EXPECT_LE(testing::mean_level_difference(out.images[0].pixels, g["image_u8"]), 2.0);
  else
    EXPECT_LE(testing::max_level_difference(out.images[0], g["image_u8"]), 1);
  // The image says what the cache did.
  EXPECT_EQ(out.images[0].metadata.at("cache"), g.meta("cache"));
  std::string reused;
  int step = 0;
  for (const auto& [context, computed] : golden_decisions(g)) {
    if (context != 0) continue;
    ++step;
    if (!computed) reused += (reused.empty() ? "" : ",") + std::to_string(step);
  }
  EXPECT_EQ(out.images[0].metadata.at("cache_reused").substr(0, reused.size()), reused);
}

INSTANTIATE_TEST_SUITE_P(Goldens, FirstBlockCache,
                         ::testing::Values("fbc_flux_dev_64x64_s31", "fbc_flux_schnell_48x80_s32",
                                           "fbc_flux_dev_true_cfg_64x64_s33", "fbc_flux_dev_bf16_64x64_s34"));

// transformer().enable_cache is what the request's `cache` is, a request's "none" turns it off for that call,
// and a cache that skips nothing (threshold 0) gives the uncached image exactly.
TEST(FirstBlockCache, EnabledOnTheTransformerOrAskedForByTheCall) {
  const CacheCase g("fbc_flux_dev_64x64_s31");
  FluxPipeline pipe = FluxPipeline::from_pretrained(testing::data_path("models/" + g.meta("model")));
  const PipelineOutput by_request = pipe(g.cached_request());
  pipe.transformer().enable_cache(parse_step_cache(g.meta("cache")));
  const PipelineOutput enabled = pipe(g.request());
  EXPECT_EQ(enabled.images[0].pixels, by_request.images[0].pixels);
  EXPECT_EQ(decisions_of(*pipe.transformer().step_cache()), golden_decisions(g));

  PipelineRequest none = g.request();
  none.cache = "none";
  const PipelineOutput uncached = pipe(none);
  EXPECT_TRUE(pipe.transformer().step_cache()->decisions().empty());
  EXPECT_EQ(uncached.images[0].metadata.count("cache"), 0u);
  EXPECT_NE(uncached.images[0].pixels, enabled.images[0].pixels);

  PipelineRequest never = g.request();
  never.cache = "fbcache:0";
  EXPECT_EQ(pipe(never).images[0].pixels, uncached.images[0].pixels);
  EXPECT_EQ(pipe.transformer().step_cache()->decisions().size(), 12u);

  pipe.transformer().disable_cache();
  EXPECT_EQ(pipe(g.request()).images[0].pixels, uncached.images[0].pixels);
}

// Deferred-and-fused eager and compiled blocks take the same decisions and give the same image; compile mode
// (the whole transformer one program) refuses a cache, naming compile-blocks.
TEST(FirstBlockCache, EveryModeTakesTheSameDecisions) {
  const CacheCase g("fbc_flux_dev_true_cfg_64x64_s33");
  const auto eager = g.load();
  const PipelineOutput reference = (*eager)(g.cached_request());
  for (ExecutionMode mode : {ExecutionMode::Fuse, ExecutionMode::CompileBlocks}) {
    const auto pipe = g.load();
    pipe->configure({.mode = mode});
    const PipelineOutput out = (*pipe)(g.cached_request());
    EXPECT_EQ(decisions_of(*pipe->denoiser().step_cache()), golden_decisions(g)) << execution_mode_name(mode);
    EXPECT_LE(testing::max_level_difference(out.images[0], reference.images[0]), 1)
        << execution_mode_name(mode);
  }
  const auto compiled = g.load();
  compiled->configure({.mode = ExecutionMode::Compile});
  try {
    (*compiled)(g.cached_request());
    ADD_FAILURE() << "compile mode ran a step cache";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "cache");
    EXPECT_NE(std::string(e.what()).find("compile-blocks"), std::string::npos) << e.what();
  }
}

// MagCache with diffusers' FLUX_MAG_RATIOS resampled to the call's steps: diffusers' decision at every
// evaluation (they follow from the ratios and the config), its image, and its calibration's ratios.
class MagCache : public ::testing::TestWithParam<const char*> {};

TEST_P(MagCache, TakesDiffusersDecisionsAndGivesItsImage) {
  const CacheCase g(GetParam());
  const auto pipe = g.load();
  const PipelineOutput out = (*pipe)(g.cached_request());
  const nn::StepCache& cache = *pipe->denoiser().step_cache();
  EXPECT_EQ(decisions_of(cache), golden_decisions(g));
  ASSERT_EQ(out.images.size(), 1u);
  EXPECT_LE(testing::max_level_difference(out.images[0], g["image_u8"]), 1);
  EXPECT_EQ(out.images[0].metadata.at("cache"), step_cache_spec(parse_step_cache(g.meta("cache"))));
  if (g.file.contains("calibration_ratios")) {
    const std::vector<double> expected = g["calibration_ratios"].to_vector<double>();
    ASSERT_EQ(cache.calibrated_mag_ratios().size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_NEAR(cache.calibrated_mag_ratios()[i], expected[i], 1e-4) << "step " << i;
    EXPECT_EQ(out.images[0].metadata.count("mag_ratios"), 1u);
    // The measured ratios given back skip steps (the tiny model's residual changes a lot: a large threshold).
    PipelineRequest again = g.request();
    again.cache = "magcache:0.5:ratios=" + out.images[0].metadata.at("mag_ratios");
    (*pipe)(again);
    EXPECT_EQ(cache.decisions().size(), expected.size());
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, MagCache,
                         ::testing::Values("mag_flux_dev_64x64_s41", "mag_flux_dev_true_cfg_64x64_s42",
                                           "mag_calibrate_flux_schnell_48x80_s43"));

// TaylorSeer on every attention of the blocks: diffusers' schedule (the forecast evaluations) and its image,
// the factors kept in bfloat16 (its default) or float32 of order 2 with a cool-down, true CFG's contexts
// apart; compiled blocks refuse it by name.
class TaylorSeer : public ::testing::TestWithParam<const char*> {};

TEST_P(TaylorSeer, ForecastsAsDiffusersDoesAndGivesItsImage) {
  const CacheCase g(GetParam());
  const auto pipe = g.load();
  const PipelineOutput out = (*pipe)(g.cached_request());
  EXPECT_EQ(decisions_of(*pipe->denoiser().step_cache()), golden_decisions(g));
  ASSERT_EQ(out.images.size(), 1u);
  EXPECT_LE(testing::max_level_difference(out.images[0], g["image_u8"]), 1);
  EXPECT_EQ(out.images[0].metadata.at("cache"), g.meta("cache"));
}

INSTANTIATE_TEST_SUITE_P(Goldens, TaylorSeer,
                         ::testing::Values("taylor_flux_dev_64x64_s51",
                                           "taylor_flux_dev_true_cfg_64x64_s52"));

TEST(TaylorSeer, RunsInTheEagerModesOnly) {
  const CacheCase g("taylor_flux_dev_64x64_s51");
  const auto fused = g.load();
  fused->configure({.mode = ExecutionMode::Fuse});
  EXPECT_LE(testing::max_level_difference((*fused)(g.cached_request()).images[0], g["image_u8"]), 1);
  const auto blocks = g.load();
  blocks->configure({.mode = ExecutionMode::CompileBlocks});
  try {
    (*blocks)(g.cached_request());
    ADD_FAILURE() << "compiled blocks ran TaylorSeer";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "cache");
    EXPECT_NE(std::string(e.what()).find("eager modes"), std::string::npos) << e.what();
  }
}

TEST(StepCacheSpec, ReadsWhatItWrites) {
  for (const char* spec :
       {"fbcache:0.12", "magcache:0.06:max_skip=3:retention=0.2", "magcache:calibrate",
        "magcache:0.1:max_skip=2:retention=0.1:ratios=1,1.2,0.9", "taylorseer:interval=5:warmup=3:order=1",
        "taylorseer:interval=3:warmup=2:order=2:until=10:factors=f32"})
    EXPECT_EQ(step_cache_spec(parse_step_cache(spec)), spec);
  const auto mag = std::get<MagCacheConfig>(parse_step_cache("magcache:0.06"));
  EXPECT_EQ(mag.max_skip_steps, 3);
  EXPECT_DOUBLE_EQ(mag.retention_ratio, 0.2);
  EXPECT_TRUE(mag.mag_ratios.empty());
  EXPECT_EQ(flux_mag_ratios().size(), 28u);
  const auto taylor = std::get<TaylorSeerCacheConfig>(parse_step_cache("taylorseer"));
  EXPECT_EQ(taylor.cache_interval, 5);
  EXPECT_EQ(taylor.disable_cache_before_step, 3);
  EXPECT_EQ(taylor.factors_dtype, bfloat16);
  for (const char* bad : {"magcache", "magcache:x", "magcache:0.1:max_skip=1.5", "magcache:0.1:retention=2",
                          "magcache:0.1:ratios=1,,2", "magcache:0.1:colour=red", "magcache:calibrate:0.1",
                          "taylorseer:interval=0", "taylorseer:warmup=0", "taylorseer:order=1.5",
                          "taylorseer:factors=f16", "taylorseer:5"})
    EXPECT_THROW(parse_step_cache(bad), Error) << bad;
}

TEST(FirstBlockCache, BadSpecsAreRefusedByName) {
  const auto pipe = CacheCase("fbc_flux_dev_64x64_s31").load();
  for (const char* spec :
       {"fbcache", "fbcache:", "fbcache:-1", "fbcache:abc", "fbcache:nan", "taylorseer:3", ""}) {
    PipelineRequest r;
    r.prompt = "x";
    r.cache = spec;
    try {
      pipe->check_request(r);
      ADD_FAILURE() << "accepted " << spec;
    } catch (const RequestError& e) {
      EXPECT_EQ(e.field(), "cache") << spec;
      EXPECT_NE(std::string(e.what()).find("fbcache:THRESHOLD"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(pipe->components()[0].second->enable_cache(FirstBlockCacheConfig{}), Error);  // a text encoder
}

}  // namespace
}  // namespace kiln
