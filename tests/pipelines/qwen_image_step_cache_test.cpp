// Step caching on Qwen-Image against diffusers 0.42.1's own hooks (tools/goldens/step_cache_qwen_image.py) on
// the tiny QwenImagePipeline: First Block Cache, MagCache (with the ratios its calibration measured:
// diffusers ships none for Qwen-Image) and TaylorSeer take diffusers' decision at every transformer
// evaluation (true CFG's "uncond" context its own), with the change that decided it, and give diffusers'
// image: float32 within one 8-bit level, bfloat16 within its noise. Compiled blocks take First Block Cache's
// decisions and give its image; they refuse TaylorSeer, and compile mode any cache, by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kiln/families/qwen_image/qwen_image_pipeline.h"
#include "kiln/families/qwen_image/qwen_image_transformer.h"
#include "support/pipeline_comparison.h"
#include "support/step_cache_goldens.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct QwenCacheCase : testing::StepCacheCase {
  explicit QwenCacheCase(const std::string& name) : StepCacheCase("step_cache_qwen_image", name) {}
};

using testing::Decisions;
using testing::decisions_of;
using testing::golden_decisions;

// The change that decided each evaluation (First Block Cache's relative change, MagCache's accumulated
// error), -1 where diffusers measured none.
void expect_changes_match(const nn::StepCache& cache, const QwenCacheCase& g) {
  const std::vector<double> changes = g["change"].to_vector<double>();
  ASSERT_EQ(cache.decisions().size(), changes.size()) << g.name;
  double largest = 0;
  for (size_t i = 0; i < changes.size(); ++i) {
    if (changes[i] < 0) {
      EXPECT_EQ(cache.decisions()[i].change, -1) << g.name << " evaluation " << i;
    } else {
      EXPECT_NEAR(cache.decisions()[i].change, changes[i], g.bf16() ? 1e-2 : 1e-4)
          << g.name << " evaluation " << i;
      largest = std::max(largest, std::abs(cache.decisions()[i].change - changes[i]));
    }
  }
  std::printf("[ change   ] %s: within %.2g of diffusers'\n", g.name.c_str(), largest);
}

// The image within one 8-bit level of diffusers' (float32), or within bfloat16's noise; its text names the
// cache and the cond steps (from 1) whose blocks were reused.
void expect_image_matches(const PipelineOutput& out, const QwenCacheCase& g) {
  ASSERT_EQ(out.images.size(), 1u) << g.name;
  if (g.bf16()) {
    const double mean = testing::mean_level_difference(out.images[0].pixels, g["image_u8"]);
    std::printf("[ levels   ] %s: mean %.3f vs diffusers\n", g.name.c_str(), mean);
    EXPECT_LE(mean, 2.0) << g.name;
  } else {
    const int largest = testing::max_level_difference(out.images[0], g["image_u8"]);
    std::printf("[ levels   ] %s: at most %d vs diffusers\n", g.name.c_str(), largest);
    EXPECT_LE(largest, 1) << g.name;
  }
  EXPECT_EQ(out.images[0].metadata.at("cache"), step_cache_spec(parse_step_cache(g.meta("cache"))));
  const std::string reused = testing::golden_reused_steps(g);
  EXPECT_EQ(out.images[0].metadata.at("cache_reused").substr(0, reused.size()), reused) << g.name;
}

// The call with the golden's cache; the latents after the first and the last step checked against diffusers'.
PipelineOutput run_checking_latents(DiffusionPipeline& pipe, const QwenCacheCase& g) {
  const double tolerance = g.bf16() ? 3e-2 : 2e-4;
  return testing::run_checking_latents(pipe, g, tolerance);
}

class QwenImageFirstBlockCache : public ::testing::TestWithParam<const char*> {};

TEST_P(QwenImageFirstBlockCache, TakesDiffusersDecisionsAndGivesItsImage) {
  const QwenCacheCase g(GetParam());
  const auto pipe = g.load();
  const PipelineOutput out = run_checking_latents(*pipe, g);
  const nn::StepCache& cache = *pipe->denoiser().step_cache();
  EXPECT_EQ(decisions_of(cache), golden_decisions(g));
  expect_changes_match(cache, g);
  expect_image_matches(out, g);
}

INSTANTIATE_TEST_SUITE_P(Goldens, QwenImageFirstBlockCache,
                         ::testing::Values("fbc_64x64_s61", "fbc_48x80_s62", "fbc_true_cfg_64x64_s63",
                                           "fbc_bf16_64x64_s64"));

// MagCache with the ratios diffusers' calibration measured on the tiny model, and the calibration itself.
class QwenImageMagCache : public ::testing::TestWithParam<const char*> {};

TEST_P(QwenImageMagCache, TakesDiffusersDecisionsAndGivesItsImage) {
  const QwenCacheCase g(GetParam());
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

INSTANTIATE_TEST_SUITE_P(Goldens, QwenImageMagCache,
                         ::testing::Values("mag_calibrate_64x64_s71", "mag_64x64_s72",
                                           "mag_true_cfg_64x64_s73"));

// Kiln's own calibration, given back as `ratios=` (what `kiln generate --cache magcache:calibrate` prints and
// the image's text keeps), takes the decisions diffusers took with its calibration's ratios.
TEST(QwenImageMagCache, ItsOwnCalibrationGivesDiffusersDecisions) {
  const QwenCacheCase calibration("mag_calibrate_64x64_s71"), cached("mag_64x64_s72");
  const auto pipe = calibration.load();
  const PipelineOutput measured = (*pipe)(calibration.cached_request());
  const std::string spec = cached.meta("cache");
  PipelineRequest request = cached.request();
  request.cache =
      spec.substr(0, spec.find(":ratios=")) + ":ratios=" + measured.images[0].metadata.at("mag_ratios");
  const PipelineOutput out = (*pipe)(request);
  EXPECT_EQ(decisions_of(*pipe->denoiser().step_cache()), golden_decisions(cached));
  EXPECT_LE(testing::max_level_difference(out.images[0], cached["image_u8"]), 1);
}

// TaylorSeer on every block's attention (transformer_blocks.N.attn): diffusers' schedule and its image, with
// its defaults, with float32 factors of order 2, a cool-down and true CFG, and in bfloat16.
class QwenImageTaylorSeer : public ::testing::TestWithParam<const char*> {};

TEST_P(QwenImageTaylorSeer, ForecastsAsDiffusersDoesAndGivesItsImage) {
  const QwenCacheCase g(GetParam());
  const auto pipe = g.load();
  const PipelineOutput out = run_checking_latents(*pipe, g);
  EXPECT_EQ(decisions_of(*pipe->denoiser().step_cache()), golden_decisions(g));
  expect_image_matches(out, g);
}

INSTANTIATE_TEST_SUITE_P(Goldens, QwenImageTaylorSeer,
                         ::testing::Values("taylor_64x64_s81", "taylor_true_cfg_64x64_s82",
                                           "taylor_bf16_64x64_s83"));

// The forecast is what makes TaylorSeer's image: without it (the attentions computed at every step) the image
// is another.
TEST(QwenImageTaylorSeer, TheAttentionsAreForecast) {
  const QwenCacheCase g("taylor_64x64_s81");
  const auto pipe = g.load();
  PipelineRequest uncached = g.request();
  uncached.cache = "none";
  EXPECT_GT(testing::mean_level_difference((*pipe)(uncached).images[0].pixels, g["image_u8"]), 0.5);
}

// Compiled blocks take First Block Cache's decisions and give its image (the decision stays on the host);
// they refuse TaylorSeer, which forecasts inside a block, and compile mode refuses any cache, naming
// compile-blocks. Deferred-and-fused eager runs TaylorSeer.
TEST(QwenImageStepCache, ExecutionModes) {
  const QwenCacheCase fbc("fbc_true_cfg_64x64_s63"), taylor("taylor_64x64_s81");
  const auto blocks = fbc.load();
  blocks->configure({.mode = ExecutionMode::CompileBlocks});
  const PipelineOutput out = (*blocks)(fbc.cached_request());
  EXPECT_EQ(decisions_of(*blocks->denoiser().step_cache()), golden_decisions(fbc));
  EXPECT_LE(testing::max_level_difference(out.images[0], fbc["image_u8"]), 1);
  try {
    (*blocks)(taylor.cached_request());
    ADD_FAILURE() << "compiled blocks ran TaylorSeer";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "cache");
    EXPECT_NE(std::string(e.what()).find("eager modes"), std::string::npos) << e.what();
  }

  const auto compiled = fbc.load();
  compiled->configure({.mode = ExecutionMode::Compile});
  try {
    (*compiled)(fbc.cached_request());
    ADD_FAILURE() << "compile mode ran a step cache";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "cache");
    EXPECT_NE(std::string(e.what()).find("compile-blocks"), std::string::npos) << e.what();
  }

  const auto fused = taylor.load();
  fused->configure({.mode = ExecutionMode::Fuse});
  const PipelineOutput forecast = (*fused)(taylor.cached_request());
  EXPECT_EQ(decisions_of(*fused->denoiser().step_cache()), golden_decisions(taylor));
  EXPECT_LE(testing::max_level_difference(forecast.images[0], taylor["image_u8"]), 1);
}

// QwenImagePipeline takes the request field `cache`; transformer().enable_cache is what the field is, and a
// call's "none" turns it off.
TEST(QwenImageStepCache, EnabledOnTheTransformerOrAskedForByTheCall) {
  const QwenCacheCase g("fbc_64x64_s61");
  QwenImagePipeline pipe =
      QwenImagePipeline::from_pretrained(testing::data_path("models/" + g.meta("model")));
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
  pipe.transformer().disable_cache();
  EXPECT_EQ(pipe(g.request()).images[0].pixels, uncached.images[0].pixels);

  PipelineRequest bad = g.request();
  bad.cache = "fbcache:abc";
  try {
    pipe.check_request(bad);
    ADD_FAILURE() << "accepted " << *bad.cache;
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "cache");
  }
}

// MagCache without ratios of its own takes the published ones, and there are none for Qwen-Image (diffusers
// refuses such a config too): refused naming the field and the way to measure them, before any work.
TEST(QwenImageMagCache, NoRatiosOfItsOwnIsRefused) {
  const QwenCacheCase g("fbc_64x64_s61");
  QwenImagePipeline pipe =
      QwenImagePipeline::from_pretrained(testing::data_path("models/" + g.meta("model")));
  PipelineRequest request = g.request();
  request.cache = "magcache:0.3";
  try {
    pipe(request);
    ADD_FAILURE() << "MagCache ran on Qwen-Image without ratios";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "cache");
    EXPECT_NE(std::string(e.what()).find("magcache:calibrate"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(pipe.transformer().step_cache()->decisions().empty());
  request.cache = "magcache:calibrate";
  EXPECT_NO_THROW(pipe(request));
}

}  // namespace
}  // namespace kiln
