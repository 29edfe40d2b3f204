// FLUX.1's true classifier-free guidance (true_cfg_scale with negative_prompt) against diffusers' own
// FluxPipeline, FluxImg2ImgPipeline, FluxInpaintPipeline and FluxKontextPipeline (tools/goldens/true_cfg.py):
// the negative prompt's embeddings, the latents after the first step and at the end, and the image; float32
// within one 8-bit level, bfloat16 within its noise. Also: diffusers' rules for when it runs, and the fields
// the other pipelines refuse by name.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "kiln/core/log.h"
#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/io/safetensors.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "pipelines/call_control.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct TrueCfgCase : testing::GoldenFile {
  explicit TrueCfgCase(const std::string& case_name) : GoldenFile("true_cfg", case_name) {}
  bool bf16() const { return meta("dtype") == "bfloat16"; }
};

class TrueCfg : public ::testing::TestWithParam<const char*> {};

TEST_P(TrueCfg, EveryStageAndTheImageMatchDiffusers) {
  const TrueCfgCase g(GetParam());
  const auto pipe = g.load();
  ASSERT_EQ(pipe->class_name(), g.meta("pipeline"));
  const PipelineRequest request = g.request();
  const double tolerance = g.bf16() ? 3e-2 : 2e-4;

  // The negative prompt is encoded as a prompt is (negative_prompt_2 for T5, negative_prompt when absent).
  const auto& flux = dynamic_cast<const FluxPipeline&>(*pipe);
  const auto negative = flux.encode_prompt(*request.negative_prompt, request.negative_prompt_2, 1,
                                           *request.max_sequence_length);
  EXPECT_TRUE(testing::rel_max_error_within(negative.prompt_embeds, g["negative_prompt_embeds"], tolerance));
  EXPECT_TRUE(testing::rel_max_error_within(negative.pooled_prompt_embeds, g["negative_pooled_prompt_embeds"],
                                            tolerance));

  std::vector<Tensor> steps;
  PipelineRequest traced = request;
  traced.callback_on_step_end = [&](StepState& s) { steps.push_back(s.latents.contiguous()); };
  const PipelineOutput out = (*pipe)(traced);
  ASSERT_EQ(static_cast<int>(steps.size()), std::stoi(g.meta("steps_run")));
  EXPECT_TRUE(testing::rel_max_error_within(steps.front(), g["latents_step0"], tolerance))
      << "after the first step";
  EXPECT_TRUE(testing::rel_max_error_within(steps.back(), g["latents_final"], tolerance))
      << "the final latents";
  ASSERT_EQ(out.images.size(), 1u);
  if (g.bf16())
    EXPECT_LE(testing::mean_level_difference(out.images[0].pixels, g["image_u8"]), 2.0);
  else
    EXPECT_LE(testing::max_level_difference(out.images[0], g["image_u8"]), 1);
  EXPECT_EQ(out.images[0].metadata.at("negative_prompt"), g.meta("negative_prompt"));
  EXPECT_EQ(std::stof(out.images[0].metadata.at("true_cfg_scale")), std::stof(g.meta("true_cfg_scale")));

  // The guidance is not a no-op on these models: without it the image is another one.
  PipelineRequest plain = request;
  plain.true_cfg_scale.reset();
  plain.negative_prompt.reset();
  plain.negative_prompt_2.reset();
  EXPECT_GT(testing::max_level_difference((*pipe)(plain).images[0], g["image_u8"]), 8);
}

INSTANTIATE_TEST_SUITE_P(Goldens, TrueCfg,
                         ::testing::Values("flux_dev_64x64_s21", "flux_schnell_prompt2_48x80_s22",
                                           "flux_dev_bf16_64x64_s23", "flux_img2img_64x64_s24",
                                           "flux_inpaint_64x64_s25", "kontext_s26"));

// The small call with a seed.
PipelineRequest small_call() {
  PipelineRequest r = testing::small_request();
  r.generator = Generator(4);
  return r;
}

// diffusers' do_true_cfg = true_cfg_scale > 1 and a negative prompt: otherwise the call is the plain one, bit
// for bit, and Kiln says which argument had no effect.
TEST(TrueCfgRules, WithoutBothArgumentsTheCallIsThePlainOneWithAWarning) {
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"));
  const std::vector<uint8_t> plain = pipe(small_call()).images[0].pixels;
  const auto run = [&](PipelineRequest r, const std::string& warned) {
    std::vector<std::string> warnings;
    auto previous = set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
    const PipelineOutput out = pipe(r);
    set_warning_handler(previous);
    EXPECT_EQ(out.images[0].pixels, plain) << warned;
    EXPECT_EQ(out.images[0].metadata.count("true_cfg_scale"), 0u);
    bool found = false;
    for (const std::string& w : warnings) found = found || w.find(warned) != std::string::npos;
    EXPECT_TRUE(found) << "expected a warning containing: " << warned;
  };
  PipelineRequest r = small_call();
  r.negative_prompt = "blurry";
  run(r, "negative_prompt is ignored unless true_cfg_scale > 1");
  r.true_cfg_scale = 1.0f;
  run(r, "negative_prompt is ignored unless true_cfg_scale > 1");
  r = small_call();
  r.true_cfg_scale = 4.0f;
  run(r, "true_cfg_scale has no effect without negative_prompt");
  r.negative_prompt_2 = "blurry";
  run(r, "negative_prompt_2 is ignored without negative_prompt");

  // An empty negative prompt is a negative prompt (diffusers: `negative_prompt is not None`).
  r = small_call();
  r.negative_prompt = "";
  r.true_cfg_scale = 4.0f;
  EXPECT_NE(pipe(r).images[0].pixels, plain);
}

// The request with the image (and mask) an editing pipeline needs, as placeholders: the checks read only
// their presence.
PipelineRequest with_inputs(const std::string& pipeline, PipelineRequest r) {
  const bool editing = pipeline.find("Img2Img") != std::string::npos ||
                       pipeline.find("Inpaint") != std::string::npos ||
                       pipeline.find("Fill") != std::string::npos;
  if (editing) r.image = {Image()};
  if (pipeline.find("Inpaint") != std::string::npos || pipeline.find("Fill") != std::string::npos)
    r.mask_image = Image();
  return r;
}

void expect_refused(const std::string& pipeline, const PipelineRequest& r, const std::string& field,
                    const std::string& words) {
  testing::expect_refused(pipeline, with_inputs(pipeline, r), field, words);
}

TEST(TrueCfgRules, OtherPipelinesRefuseItByName) {
  PipelineRequest scale;
  scale.true_cfg_scale = 3.0f;
  for (const char* pipeline :
       {"StableDiffusion3Pipeline", "StableDiffusion3Img2ImgPipeline", "Flux2Pipeline", "Flux2KleinPipeline"})
    expect_refused(pipeline, scale, "true_cfg_scale", "the FLUX.1 and Qwen-Image pipelines do");
  expect_refused("FluxFillPipeline", scale, "true_cfg_scale", "FluxFillPipeline takes no true_cfg_scale");
  PipelineRequest negative;
  negative.negative_prompt = "blurry";
  expect_refused("FluxFillPipeline", negative, "negative_prompt",
                 "FluxFillPipeline takes no negative_prompt");
  PipelineRequest third;
  third.negative_prompt_3 = "blurry";
  expect_refused("FluxPipeline", third, "negative_prompt_3", "the third text encoder's");
  expect_refused("FluxKontextPipeline", third, "negative_prompt_3",
                 "FluxKontextPipeline takes no negative_prompt_3");
  // Kontext's sizes, which no other pipeline reads, are refused rather than ignored.
  PipelineRequest area;
  area.max_area = 4096;
  for (const char* pipeline :
       {"FluxPipeline", "FluxImg2ImgPipeline", "StableDiffusion3Pipeline", "Flux2Pipeline"})
    expect_refused(pipeline, area, "max_area", "FluxKontextPipeline does");
  PipelineRequest resize;
  resize.auto_resize = false;
  expect_refused("FluxPipeline", resize, "auto_resize", "takes no auto_resize");
  // The FLUX.1 pipelines that take it accept it.
  PipelineRequest both = scale;
  both.negative_prompt = "blurry";
  both.negative_prompt_2 = "blurry";
  for (const char* pipeline :
       {"FluxPipeline", "FluxImg2ImgPipeline", "FluxInpaintPipeline", "FluxKontextPipeline"})
    EXPECT_NO_THROW(pipeline_class(pipeline, "").check_fields(with_inputs(pipeline, both))) << pipeline;
}

TEST(TrueCfgRules, ScaleOutOfRangeIsNamed) {
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-schnell"));
  for (float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    PipelineRequest r = small_call();
    r.negative_prompt = "blurry";
    r.true_cfg_scale = bad;
    try {
      pipe(r);
      ADD_FAILURE() << "took true_cfg_scale " << bad;
    } catch (const RequestError& e) {
      EXPECT_EQ(e.field(), "true_cfg_scale");
      EXPECT_NE(std::string(e.what()).find("true_cfg_scale must be a finite value >= 0"), std::string::npos)
          << e.what();
    }
  }
}

// Tensor-parallel ranks compare the keys of their calls: a call differing only in these fields is another.
TEST(TrueCfgRules, RequestKeyTellsTheFieldsApart) {
  const PipelineRequest base = small_call();
  const uint64_t key = pipelines::request_key(base);
  PipelineRequest r = base;
  r.true_cfg_scale = 2.0f;
  EXPECT_NE(pipelines::request_key(r), key);
  r = base;
  r.max_area = 4096;
  EXPECT_NE(pipelines::request_key(r), key);
  r = base;
  r.auto_resize = false;
  EXPECT_NE(pipelines::request_key(r), key);
  r = base;
  r.output_type = OutputType::Latent;
  EXPECT_NE(pipelines::request_key(r), key);
  EXPECT_EQ(pipelines::request_key(base), key);
}

}  // namespace
}  // namespace kiln
