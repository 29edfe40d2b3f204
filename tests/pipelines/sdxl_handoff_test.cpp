// SDXL's base -> refiner hand-off in latents against diffusers 0.42 (tools/goldens/sd_handoff.py): the base
// stops at denoising_end and returns its latents (output_type "latent"), the refiner starts from them at the
// same denoising_start, with the folders' Euler sampler, DPM-Solver++ 2M (multistep: its history starts fresh
// in the refiner) and through inpainting on both sides. The script checks that the image moves with
// denoising_end; here the base's latents at the other fraction are compared too, so a dropped cutoff fails.
#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "kiln/ops.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::GoldenFile;

std::unique_ptr<DiffusionPipeline> load(const GoldenFile& g, const char* pipeline, const char* model) {
  return pipeline_class(g.meta(pipeline), g.name).load(testing::data_path("models/" + g.meta(model)), {});
}

// The base's call: the recorded one, with denoising_end and latent output.
PipelineRequest base_request(const GoldenFile& g, double denoising_end) {
  PipelineRequest r = g.text_request();
  r.denoising_end = denoising_end;
  r.output_type = OutputType::Latent;
  return r;
}

// The timesteps a call runs, recorded through callback_on_step_end, and its first step's latents.
struct Steps {
  std::vector<float> timesteps;
  Tensor first;
};
void record(PipelineRequest& r, Steps& steps) {
  r.callback_on_step_end = [&steps](StepState& s) {
    if (steps.timesteps.empty()) steps.first = s.latents.to(float32);
    steps.timesteps.push_back(s.timestep);
  };
}

class SdxlHandOff : public ::testing::TestWithParam<const char*> {};

TEST_P(SdxlHandOff, MatchesDiffusers) {
  const GoldenFile g("sd_handoff", GetParam());
  const double fraction = std::stod(g.meta("denoising_end"));
  const auto base = load(g, "base_pipeline", "base_model");
  PipelineRequest call = base_request(g, fraction);
  Steps base_steps;
  record(call, base_steps);
  const PipelineOutput handed = (*base)(call);
  ASSERT_TRUE(handed.latents.defined()) << g.name;
  EXPECT_TRUE(handed.images.empty()) << g.name;
  EXPECT_EQ(base_steps.timesteps, g["base_steps"].to_vector<float>()) << g.name;
  EXPECT_TRUE(testing::rel_max_error_within(handed.latents.to(float32), g["base_latents"], 1e-4)) << g.name;

  // The refiner from those latents, with a fresh generator of the same seed (diffusers' example).
  const auto refiner = load(g, "pipeline", "model");
  PipelineRequest refine = g.text_request();
  refine.image.clear();
  refine.image_latents = handed.latents;
  refine.denoising_start = fraction;
  Steps steps;
  record(refine, steps);
  const PipelineOutput out = (*refiner)(refine);
  EXPECT_EQ(steps.timesteps, g["refiner_steps"].to_vector<float>()) << g.name;
  EXPECT_TRUE(testing::rel_max_error_within(steps.first, g["refiner_step0"], 1e-4)) << g.name;
  testing::expect_images_match(out, g);
  // The image says which part of the schedule it comes from; strength, ignored, is not recorded.
  EXPECT_EQ(out.images[0].metadata.at("denoising_start"), std::to_string(fraction)) << g.name;
  EXPECT_EQ(out.images[0].metadata.count("strength"), 0u) << g.name;

  // Another denoising_end: the base's latents are diffusers' there too, and not those at `fraction`.
  const PipelineOutput earlier = (*base)(base_request(g, std::stod(g.meta("other_denoising_end"))));
  EXPECT_TRUE(testing::rel_max_error_within(earlier.latents.to(float32), g["base_latents_earlier"], 1e-4))
      << g.name;
  EXPECT_FALSE(testing::rel_max_error_within(earlier.latents.to(float32), g["base_latents"], 1e-2)) << g.name;
}

INSTANTIATE_TEST_SUITE_P(Goldens, SdxlHandOff,
                         ::testing::Values("handoff_euler_48x40_s0", "handoff_dpmpp2m_32x32_s1",
                                           "handoff_inpaint_ref_a_40x48_s2"));

// The refiner's latents given as the image, read from the golden (not the base's run): the refiner alone
// reproduces diffusers' final latents, so the hand-off does not depend on the base being run in the process.
TEST(SdxlHandOffRefiner, FromRecordedLatents) {
  const GoldenFile g("sd_handoff", "handoff_euler_48x40_s0");
  const auto refiner = load(g, "pipeline", "model");
  PipelineRequest refine = g.text_request();
  refine.image_latents = g["base_latents"];
  refine.denoising_start = std::stod(g.meta("denoising_end"));
  refine.output_type = OutputType::Latent;
  const PipelineOutput out = (*refiner)(refine);
  EXPECT_TRUE(testing::rel_max_error_within(out.latents.to(float32), g["refiner_latents_final"], 1e-4));
}

// denoising_start with an image rather than latents (refining a decoded image at the hand-off's fraction):
// diffusers encodes it (its posterior sampled) and adds no noise; strength is ignored.
TEST(SdxlHandOffRefiner, FromAnImage) {
  const GoldenFile g("sd_handoff", "refine_image_ref_a_s3");
  const auto refiner = g.load();
  PipelineRequest r = g.text_request();
  r.denoising_start = std::stod(g.meta("denoising_start"));
  Steps steps;
  record(r, steps);
  const PipelineOutput out = (*refiner)(r);
  EXPECT_EQ(steps.timesteps, g["refiner_steps"].to_vector<float>());
  EXPECT_TRUE(testing::rel_max_error_within(steps.first, g["refiner_step0"], 1e-4));
  testing::expect_images_match(out, g);
  r.strength = 0.9;  // ignored
  r.callback_on_step_end = nullptr;
  EXPECT_EQ((*refiner)(r).images[0].pixels, out.images[0].pixels);
}

// Refusals name the field, before any step: latents of the wrong channels, batch or size, both an image and
// latents, a start at or past the end, a fraction that leaves no step, and the fields on classes that do not
// take them (SD1.x, the text-to-image class's denoising_start).
TEST(SdxlHandOffRefiner, RefusesBadInputByName) {
  const GoldenFile g("sd_handoff", "handoff_euler_48x40_s0");
  const auto refiner = load(g, "pipeline", "model");
  int steps_run = 0;
  PipelineRequest good = g.text_request();
  good.image_latents = g["base_latents"];
  good.denoising_start = 0.8;
  good.callback_on_step_end = [&](StepState&) { ++steps_run; };
  const auto refused = [&](const std::function<void(PipelineRequest&)>& change) {
    PipelineRequest r = good;
    change(r);
    return testing::error_message([&] { (*refiner)(r); });
  };
  std::string e = refused([](PipelineRequest& r) { r.image_latents = Tensor::zeros({1, 3, 24, 20}); });
  EXPECT_NE(e.find("image_latents must be [1 or 1 (the images of the call), 4 (the VAE's latent channels)"),
            std::string::npos)
      << e;
  e = refused([](PipelineRequest& r) { r.image_latents = Tensor::zeros({3, 4, 24, 20}); });
  EXPECT_NE(e.find("image_latents must be"), std::string::npos) << e;
  e = refused([](PipelineRequest& r) { r.image_latents = Tensor::zeros({4, 24, 20}); });
  EXPECT_NE(e.find("image_latents must be a floating-point array"), std::string::npos) << e;
  e = refused([](PipelineRequest& r) { r.height = 64; });
  EXPECT_NE(e.find("height x width 64x40 is not the size of the image_latents"), std::string::npos) << e;
  e = refused(
      [](PipelineRequest& r) { r.image = {Image::load(testing::data_path("goldens/flux2/ref_a.png"))}; });
  EXPECT_NE(e.find("give one or the other"), std::string::npos) << e;
  e = refused([](PipelineRequest& r) { r.denoising_end = 0.5; });
  EXPECT_NE(e.find("denoising_start 0.800000 must be below denoising_end 0.500000"), std::string::npos) << e;
  e = refused([](PipelineRequest& r) { r.denoising_start = 0.999; });
  EXPECT_NE(e.find("denoising_start 0.999000 leaves no step of the 10 timesteps"), std::string::npos) << e;
  e = refused([](PipelineRequest& r) { r.denoising_start = 1.0; });
  EXPECT_NE(e.find("denoising_start must be in (0, 1), got 1"), std::string::npos) << e;
  e = refused([](PipelineRequest& r) { r.denoising_start = 0.0; });
  EXPECT_NE(e.find("denoising_start must be in (0, 1), got 0"), std::string::npos) << e;
  EXPECT_EQ(steps_run, 0);

  // The base's text-to-image class has no image to start from, SD1.x no hand-off at all.
  const auto base = load(g, "base_pipeline", "base_model");
  PipelineRequest start = g.text_request();
  start.denoising_start = 0.5;
  e = testing::error_message([&] { (*base)(start); });
  EXPECT_NE(e.find("StableDiffusionXLPipeline takes no denoising_start"), std::string::npos) << e;
  EXPECT_NE(e.find("StableDiffusionXLImg2ImgPipeline"), std::string::npos) << e;
  const auto sd15 =
      pipeline_class("StableDiffusionPipeline", "").load(testing::data_path("models/sd15-tiny"), {});
  e = testing::error_message(
      [&] { (*sd15)({.prompt = "x", .denoising_end = 0.5, .height = 32, .width = 32}); });
  EXPECT_NE(e.find("StableDiffusionPipeline takes no denoising_end"), std::string::npos) << e;
  PipelineRequest no_step = base_request(g, 0.01);
  e = testing::error_message([&] { (*base)(no_step); });
  EXPECT_NE(e.find("denoising_end 0.010000 leaves no step"), std::string::npos) << e;
}

// A 9-channel inpainting UNet reads the masked image's latents, which a hand-off does not have: latents as
// the image and denoising_start are refused naming the field (diffusers fails on both).
TEST(SdxlHandOffRefiner, AnInpaintingUNetRefusesTheHandOff) {
  const auto pipe = pipeline_class("StableDiffusionXLInpaintPipeline", "")
                        .load(testing::data_path("models/sdxl-inpaint-tiny"), {});
  PipelineRequest r{.prompt = "x", .num_inference_steps = 4};
  r.mask_image = Image::load(testing::data_path("goldens/edit/mask_box.png"));
  r.image_latents = Tensor::zeros({1, 4, 16, 16});
  std::string e = testing::error_message([&] { (*pipe)(r); });
  EXPECT_NE(e.find("image_latents with an inpainting UNet (9 input channels"), std::string::npos) << e;
  r.image_latents = Tensor();
  r.image = {Image::load(testing::data_path("goldens/flux2/ref_a.png"))};
  r.denoising_start = 0.5;
  e = testing::error_message([&] { (*pipe)(r); });
  EXPECT_NE(e.find("denoising_start with an inpainting UNet"), std::string::npos) << e;
}

}  // namespace
}  // namespace kiln
