// Pyramid Attention Broadcast and FasterCache (guidance-distilled) against diffusers 0.42.1's own hooks
// (tools/goldens/step_cache_attention.py) on the tiny FLUX.1 and Qwen-Image pipelines: at every evaluation
// each attention of the blocks computes or reuses as diffusers' did (its schedule reads the scheduler's
// timestep), and the image is diffusers': float32 within one 8-bit level on 99% of the values, bfloat16
// within its noise. True classifier-free guidance, compiled blocks, malformed specs and FasterCache's
// unconditional-branch form are refused by name.
#include <gtest/gtest.h>

#include <numeric>

#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/nn/step_cache.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct AttentionCacheCase : testing::GoldenFile {
  explicit AttentionCacheCase(const std::string& name) : GoldenFile("step_cache_attention", name) {}
  bool bf16() const { return meta("dtype") == "bfloat16"; }
  PipelineRequest cached_request() const {
    PipelineRequest r = request();
    r.cache = meta("cache");
    return r;
  }
};

// Per evaluation: whether its first attention ran, and how many of its attentions ran and were reused.
struct Evaluation {
  bool computed;
  int attentions_computed, attentions_reused;
  bool operator==(const Evaluation&) const = default;
};

std::ostream& operator<<(std::ostream& out, const Evaluation& e) {
  return out << "{" << e.computed << ", ran " << e.attentions_computed << ", reused " << e.attentions_reused
             << "}";
}

std::vector<Evaluation> evaluations_of(const nn::StepCache& cache) {
  std::vector<Evaluation> out;
  for (const nn::StepCache::Decision& d : cache.decisions()) {
    EXPECT_EQ(d.context, "cond");
    out.push_back({d.computed, d.attentions_computed, d.attentions_reused});
  }
  return out;
}

std::vector<Evaluation> golden_evaluations(const AttentionCacheCase& g) {
  const Tensor modules = g["modules_computed"];
  const std::vector<int64_t> computed = modules.to_vector<int64_t>();
  const int64_t per = modules.size(1);
  std::vector<Evaluation> out;
  for (int64_t e = 0; e < modules.size(0); ++e) {
    const auto row = computed.begin() + e * per;
    const int ran = static_cast<int>(std::accumulate(row, row + per, int64_t{0}));
    out.push_back({*row != 0, ran, static_cast<int>(per) - ran});
  }
  return out;
}

// The golden's first-attention decisions as the image's text lists them: the steps (from 1) that reused.
std::string reused_steps(const AttentionCacheCase& g) {
  std::string reused;
  const std::vector<int64_t> computed = g["computed"].to_vector<int64_t>();
  for (size_t i = 0; i < computed.size(); ++i)
    if (computed[i] == 0) reused += (reused.empty() ? "" : ",") + std::to_string(i + 1);
  return reused.empty() ? "none" : reused;
}

void expect_image_matches(const PipelineOutput& out, const AttentionCacheCase& g) {
  ASSERT_EQ(out.images.size(), 1u) << g.name;
  if (g.bf16()) {
    const double mean = testing::mean_level_difference(out.images[0].pixels, g["image_u8"]);
    std::printf("[ levels   ] %s: mean %.3f vs diffusers\n", g.name.c_str(), mean);
    EXPECT_LE(mean, 2.0) << g.name;
  } else {
    const double share = testing::share_within_one_level(out.images[0].pixels, g["image_u8"]);
    std::printf("[ levels   ] %s: %.4f within one level of diffusers, at most %d\n", g.name.c_str(), share,
                testing::max_level_difference(out.images[0], g["image_u8"]));
    EXPECT_GE(share, 0.99) << g.name;
  }
}

class AttentionCache : public ::testing::TestWithParam<const char*> {};

TEST_P(AttentionCache, ComputesAndReusesAsDiffusersDoesAndGivesItsImage) {
  const AttentionCacheCase g(GetParam());
  const auto pipe = g.load();
  PipelineRequest request = g.cached_request();
  std::vector<Tensor> steps;
  request.callback_on_step_end = [&](StepState& s) { steps.push_back(s.latents.contiguous()); };
  const PipelineOutput out = (*pipe)(request);

  const std::vector<Evaluation> golden = golden_evaluations(g);
  EXPECT_EQ(evaluations_of(*pipe->denoiser().step_cache()), golden) << g.name;
  // Every case has evaluations inside its range that reuse, and ones that compute.
  EXPECT_TRUE(std::any_of(golden.begin(), golden.end(), [](const Evaluation& e) { return !e.computed; }));
  ASSERT_EQ(static_cast<int>(steps.size()), std::stoi(g.meta("steps_run")));
  const double tolerance = g.bf16() ? 3e-2 : 2e-4;
  EXPECT_TRUE(testing::rel_max_error_within(steps.front(), g["latents_step0"], tolerance)) << g.name;
  EXPECT_TRUE(testing::rel_max_error_within(steps.back(), g["latents_final"], tolerance)) << g.name;
  expect_image_matches(out, g);
  // The image's text names the cache and the steps whose attentions were reused.
  EXPECT_EQ(out.images[0].metadata.at("cache"), g.meta("cache"));
  EXPECT_EQ(out.images[0].metadata.at("cache_reused"), reused_steps(g));
}

INSTANTIATE_TEST_SUITE_P(Goldens, AttentionCache,
                         ::testing::Values("pab_flux_dev_64x64_s91", "pab_flux_dev_skip3_64x64_s92",
                                           "pab_flux_dev_bf16_64x64_s93", "pab_qwen_image_64x64_s94",
                                           "faster_flux_dev_64x64_s95", "faster_flux_dev_w03_64x64_s96",
                                           "faster_flux_dev_bf16_64x64_s97", "faster_qwen_image_64x64_s98"));

// enable_cache on the transformer is the request's cache; deferred-and-fused eager takes the same decisions
// and gives the same image.
TEST(AttentionCache, EnabledOnTheTransformerAndFused) {
  const AttentionCacheCase g("faster_flux_dev_64x64_s95");
  FluxPipeline pipe = FluxPipeline::from_pretrained(testing::data_path("models/" + g.meta("model")));
  pipe.transformer().enable_cache(FasterCacheConfig{});
  const PipelineOutput enabled = pipe(g.request());
  EXPECT_EQ(evaluations_of(*pipe.transformer().step_cache()), golden_evaluations(g));
  expect_image_matches(enabled, g);

  const auto fused = g.load();
  fused->configure({.mode = ExecutionMode::Fuse});
  const PipelineOutput out = (*fused)(g.cached_request());
  EXPECT_EQ(evaluations_of(*fused->denoiser().step_cache()), golden_evaluations(g));
  expect_image_matches(out, g);
}

// The refusal `request` meets in check_request: field "cache", its message holding every one of `words`.
void expect_cache_refused(const DiffusionPipeline& pipe, const PipelineRequest& request,
                          std::initializer_list<const char*> words) {
  try {
    pipe.check_request(request);
    ADD_FAILURE() << "accepted " << request.cache.value_or("(the enabled cache)");
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "cache");
    for (const char* w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

// diffusers' PAB and FasterCache hooks keep one state per attention for both guidance branches (and mix
// them): Kiln refuses them with true CFG, before any work, on FLUX.1 (true_cfg_scale > 1 with a negative
// prompt) and Qwen-Image (a negative prompt: its true_cfg_scale defaults to 4).
TEST(AttentionCache, TrueClassifierFreeGuidanceIsRefusedByName) {
  for (const char* name : {"pab_flux_dev_64x64_s91", "pab_qwen_image_64x64_s94"}) {
    const AttentionCacheCase g(name);
    const auto pipe = g.load();
    PipelineRequest request = g.cached_request();
    request.negative_prompt = "blurry";
    if (g.meta("pipeline") == "FluxPipeline") {
      // FLUX.1's negative prompt does nothing without true_cfg_scale > 1: no true CFG, no refusal.
      EXPECT_NO_THROW(pipe->check_request(request));
      request.true_cfg_scale = 3.0f;
    }
    expect_cache_refused(*pipe, request, {"Pyramid Attention Broadcast", "true CFG"});
    request.cache = "fastercache";
    expect_cache_refused(*pipe, request, {"FasterCache", "true CFG", "per attention"});
    // The caches that keep each branch apart take it.
    request.cache = "taylorseer";
    EXPECT_NO_THROW(pipe->check_request(request));
  }
}

// Both work inside the blocks: compiled blocks and compile mode refuse them by name.
TEST(AttentionCache, CompiledModesRefuseThemByName) {
  const AttentionCacheCase g("pab_flux_dev_64x64_s91");
  for (ExecutionMode mode : {ExecutionMode::CompileBlocks, ExecutionMode::Compile}) {
    const auto pipe = g.load();
    pipe->configure({.mode = mode});
    expect_cache_refused(*pipe, g.cached_request(), {"Pyramid Attention Broadcast", "eager modes"});
    PipelineRequest faster = g.request();
    faster.cache = "fastercache:weight=0.3";
    expect_cache_refused(*pipe, faster, {"FasterCache", "eager modes"});
  }
}

TEST(AttentionCacheSpec, ReadsWhatItWritesAndRefusesTheMalformed) {
  for (const char* spec :
       {"pab:skip=2:range=100,800", "pab:skip=3:range=50,900", "pab:skip=1:range=-1.5,999.25",
        "fastercache:skip=2:range=-1,681:weight=0.5", "fastercache:skip=3:range=200,900:weight=0.3",
        "fastercache:skip=2:range=0,1000:weight=-1"})
    EXPECT_EQ(step_cache_spec(parse_step_cache(spec)), spec);
  const auto pab = std::get<PyramidAttentionBroadcastConfig>(parse_step_cache("pab"));
  EXPECT_EQ(pab.spatial_attention_block_skip_range, 2);
  EXPECT_EQ(pab.spatial_attention_timestep_skip_range, (std::pair<double, double>{100, 800}));
  const auto faster = std::get<FasterCacheConfig>(parse_step_cache("fastercache:range=10,20"));
  EXPECT_EQ(faster.spatial_attention_block_skip_range, 2);
  EXPECT_EQ(faster.spatial_attention_timestep_skip_range, (std::pair<double, double>{10, 20}));
  EXPECT_DOUBLE_EQ(faster.attention_weight, 0.5);
  EXPECT_TRUE(faster.is_guidance_distilled);
  EXPECT_EQ(step_cache_spec(FasterCacheConfig{}), "fastercache:skip=2:range=-1,681:weight=0.5");

  for (const char* bad :
       {"pab:skip=0", "pab:skip=1.5", "pab:skip=", "pab:range=800", "pab:range=800,100", "pab:range=100,100",
        "pab:range=a,800", "pab:range=100,800,900", "pab:range=100,inf", "pab:weight=0.5", "pab:2",
        "pab:skip", "fastercache:weight=x", "fastercache:weight=nan", "fastercache:skip=-1",
        "fastercache:range=,681", "fastercache:colour=red", "fastercache:0.5"}) {
    try {
      parse_step_cache(bad);
      ADD_FAILURE() << "parsed " << bad;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("'") + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("pab[:skip=N][:range=LOW,HIGH]"), std::string::npos) << what;
      EXPECT_NE(what.find("fastercache[:skip=N][:range=LOW,HIGH][:weight=W]"), std::string::npos) << what;
    }
  }
}

// FasterCache's unconditional-branch form (is_guidance_distilled=false) needs a batch-concatenated CFG call
// and an image-shaped output: refused by name where a config enters (enable_cache, check_step_cache).
TEST(AttentionCache, FasterCacheOfTheUnconditionalBranchIsRefusedByName) {
  const auto pipe = AttentionCacheCase("faster_flux_dev_64x64_s95").load();
  try {
    pipe->denoiser().enable_cache(FasterCacheConfig{.is_guidance_distilled = false});
    ADD_FAILURE() << "enabled FasterCache with is_guidance_distilled=false";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is_guidance_distilled=false"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("batch-concatenated"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(pipe->denoiser().step_cache()->config().has_value());
  EXPECT_THROW(check_step_cache(PyramidAttentionBroadcastConfig{.spatial_attention_block_skip_range = 0}),
               Error);
  EXPECT_THROW(check_step_cache(FasterCacheConfig{.spatial_attention_timestep_skip_range = {681, -1}}),
               Error);
  EXPECT_NO_THROW(check_step_cache(FasterCacheConfig{}));
}

}  // namespace
}  // namespace kiln
