// 9-channel inpainting UNets (diffusers' num_channels_unet == 9: stable-diffusion-inpainting, SDXL
// inpainting 0.1) in StableDiffusionInpaintPipeline and StableDiffusionXLInpaintPipeline against diffusers
// 0.42, on the tiny pipelines of tools/goldens/sd_inpaint9.py: the mask and the masked image's latents handed
// to the UNet beside the latents, the generator's draws in diffusers' order (the image skipped at full
// strength), no blend; padding_mask_crop; bfloat16; the inpainting UNet alone as a single file on the base
// model's configs; the calls it cannot serve refused naming why.
#include <gtest/gtest.h>

#include "families/stable_diffusion/unet_samplers.h"
#include "io/io_test_util.h"
#include "kiln/families/stable_diffusion/stable_diffusion_pipeline.h"
#include "kiln/families/stable_diffusion/stable_diffusion_xl_pipeline.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/ops.h"
#include "pipelines/call_generators.h"
#include "pipelines/pipeline_common.h"
#include "pipelines/task_stages.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::expect_images_match;
using testing::GoldenFile;

GoldenFile golden(const char* name) {
  return GoldenFile("sd_inpaint9", name);
}

class StableDiffusionInpaint9Float32 : public ::testing::TestWithParam<const char*> {};

TEST_P(StableDiffusionInpaint9Float32, EveryStageMatchesDiffusers) {
  const GoldenFile g = golden(GetParam());
  const std::unique_ptr<DiffusionPipeline> pipe = g.load();
  // The UNet on diffusers' own 9-channel input (its mask and masked image latents in channels 4 to 8).
  const auto& unet_pipe = dynamic_cast<const UNetPipeline&>(*pipe);
  EXPECT_EQ(unet_pipe.unet().config().in_channels, 9);
  PipelineRequest request = g.request();
  Tensor first_step;
  request.callback_on_step_end = [&](StepState& s) {
    if (!first_step.defined()) first_step = s.latents.to(float32);  // the first step the strength runs
  };
  const PipelineOutput out = (*pipe)(request);
  expect_images_match(out, g);
  // No blend after the step: the latents are the sampler's, everywhere (a blend would put the noised image
  // back outside the mask and miss diffusers' first step there).
  EXPECT_TRUE(testing::rel_max_error_within(first_step, g["latents_step0"], 1e-4)) << g.name;
}

INSTANTIATE_TEST_SUITE_P(Goldens, StableDiffusionInpaint9Float32,
                         ::testing::Values("sd15_inpaint9_ref_a_s40", "sd15_inpaint9_euler_a_s41",
                                           "sd15_inpaint9_crop_s42", "sdxl_inpaint9_ref_a_s44",
                                           "sdxl_inpaint9_nocfg_s45"));

// The UNet on diffusers' recorded first input (the scaled latents, the mask and the masked image's latents
// side by side, with the call's context and SDXL's added conditions) gives diffusers' output.
TEST(StableDiffusionInpaint9, TheUnetReadsDiffusersChannels) {
  for (const char* name : {"sd15_inpaint9_ref_a_s40", "sdxl_inpaint9_ref_a_s44", "sdxl_inpaint9_nocfg_s45"}) {
    const GoldenFile g = golden(name);
    const std::unique_ptr<DiffusionPipeline> pipe = g.load();
    const auto& unet = dynamic_cast<const UNetPipeline&>(*pipe).unet();
    const Tensor x = g["unet_in_step0"];
    ASSERT_EQ(x.size(1), 9) << name;
    const float t = g["timesteps_run"].to(float32).to_vector<float>()[0];
    models::UNetAddedConditions added;
    if (g.file.contains("add_time_ids"))
      added = {.text_embeds = g["unet_text_embeds_step0"], .time_ids = g["add_time_ids"].to(float32)};
    const Tensor out = unet.forward(x, Tensor::full({x.size(0)}, static_cast<double>(t), float32),
                                    g["unet_encoder_hidden_states_step0"], added);
    EXPECT_TRUE(testing::rel_max_error_within(out, g["unet_out_step0"], 1e-4)) << name;
  }
}

// Where the call starts (the shared task stages with masked_image_channels): the latents, the mask at the
// latents' size and the masked image's latents are diffusers', drawn in its order: at strength 1 the noise
// first (the image is not encoded), below it the image's sample, the noise, then the masked image's sample;
// a batch of two repeats the mask and the masked image; padding_mask_crop crops both first.
TEST(StableDiffusionInpaint9, TheStartMatchesDiffusers) {
  for (const char* name : {"sd15_inpaint9_ref_a_s40", "sd15_inpaint9_euler_a_s41", "sd15_inpaint9_crop_s42",
                           "sdxl_inpaint9_ref_a_s44", "sdxl_inpaint9_nocfg_s45"}) {
    SCOPED_TRACE(name);
    const GoldenFile g = golden(name);
    const std::string folder = testing::data_path("models/" + g.meta("model"));
    const std::shared_ptr<models::AutoencoderKL> vae = models::load_autoencoder_kl(folder + "/vae", float32);
    const PipelineRequest request = g.request();
    const pipelines::ResolvedRequest call{.height = *request.height,
                                          .width = *request.width,
                                          .num_inference_steps = *request.num_inference_steps,
                                          .strength = request.strength.value_or(1.0)};
    const std::unique_ptr<DiscreteScheduler> schedule =
        UNetSamplers(folder + "/scheduler").for_call(request, call.num_inference_steps);
    pipelines::CallGenerators generators(request);
    const pipelines::TaskStart start = pipelines::start_latents({.task = Task::Inpainting,
                                                                 .pipeline = "test",
                                                                 .request = request,
                                                                 .call = call,
                                                                 .batch = request.num_images_per_prompt,
                                                                 .dtype = float32,
                                                                 .generators = generators,
                                                                 .schedule = *schedule,
                                                                 .codec = *vae,
                                                                 .noise_at_full_strength = true,
                                                                 .masked_image_channels = true,
                                                                 .whole_strength_steps = true});
    EXPECT_FALSE(start.blend);
    EXPECT_TRUE(testing::all_close(start.mask_latents, g["mask"], 0, 0));
    EXPECT_TRUE(testing::rel_max_error_within(start.masked_image_latents, g["masked_image_latents"], 1e-4));
    EXPECT_TRUE(testing::rel_max_error_within(start.latents, g["latents_init"], 1e-4));
  }
}

// The SD pipelines floor the steps a strength runs (get_timesteps' int(n * strength)): SDXL inpainting's
// default 0.9999 of 5 steps runs 4 from the second, here with the 4-channel UNet and its blend.
TEST(StableDiffusionInpaint9, TheStepsAStrengthRunsAreFloored) {
  const GoldenFile g = golden("sdxl_inpaint4_strength_s46");
  const std::unique_ptr<DiffusionPipeline> pipe = g.load();
  EXPECT_EQ(dynamic_cast<const UNetPipeline&>(*pipe).unet().config().in_channels, 4);
  PipelineRequest request = g.request();
  int steps = 0;
  Tensor first_step;
  request.callback_on_step_end = [&](StepState& s) {
    if (!first_step.defined()) first_step = s.latents.to(float32);  // the first step the strength runs
    ++steps;
  };
  expect_images_match((*pipe)(request), g);
  EXPECT_EQ(steps, 4);
  EXPECT_TRUE(testing::rel_max_error_within(first_step, g["latents_step0"], 1e-4));
}

TEST(StableDiffusionInpaint9, Bfloat16StaysWithinItsNoise) {
  const GoldenFile g = golden("sd15_inpaint9_bf16_s40");
  const PipelineOutput out = (*g.load())(g.request());
  const double mean = testing::mean_level_difference(out.images[0].pixels, g["image_u8"].select(0, 0));
  std::printf("[ levels   ] sd15_inpaint9_bf16_s40: mean %.3f vs diffusers\n", mean);
  EXPECT_LE(mean, 2.0);
}

// The image depends on the prompt: the same call with another prompt moves it by several levels.
TEST(StableDiffusionInpaint9, ThePromptChangesTheImage) {
  for (const char* name : {"sd15_inpaint9_ref_a_s40", "sdxl_inpaint9_ref_a_s44"}) {
    const GoldenFile g = golden(name);
    PipelineRequest request = g.request();
    request.prompt = "a lighthouse on a cliff above a stormy sea, dramatic clouds";
    const PipelineOutput out = (*g.load())(request);
    EXPECT_GT(testing::mean_level_difference(out.images[0].pixels, g["image_u8"].select(0, 0)), 2.0) << name;
  }
}

// Without a mask the inpainting UNet has nothing for 5 of its channels: text-to-image and image-to-image
// (the folder's sibling classes, or from_pipe) are refused naming why and the class that runs it; the
// inpainting class from the same pipeline runs.
TEST(StableDiffusionInpaint9, TextToImageAndImageToImageAreRefused) {
  const std::string folder = testing::data_path("models/sd15-inpaint-tiny");
  const GoldenFile g = golden("sd15_inpaint9_ref_a_s40");
  PipelineRequest text = g.request();
  text.image.clear();
  text.mask_image.reset();
  text.strength.reset();
  StableDiffusionPipeline sd = StableDiffusionPipeline::from_pretrained(folder);
  EXPECT_KILN_ERROR(sd(text), "StableDiffusionPipeline: the UNet takes 9 input channels",
                    "an inpainting UNet",
                    "run it as StableDiffusionInpaintPipeline with an image and a mask_image");
  PipelineRequest image = g.request();
  image.mask_image.reset();
  EXPECT_KILN_ERROR(StableDiffusionImg2ImgPipeline::from_pipe(sd)(image),
                    "StableDiffusionImg2ImgPipeline: the UNet takes 9 input channels");
  expect_images_match(StableDiffusionInpaintPipeline::from_pipe(sd)(g.request()), g);

  StableDiffusionXLPipeline xl =
      StableDiffusionXLPipeline::from_pretrained(testing::data_path("models/sdxl-inpaint-tiny"));
  EXPECT_KILN_ERROR(xl(text), "StableDiffusionXLPipeline: the UNet takes 9 input channels",
                    "run it as StableDiffusionXLInpaintPipeline");
}

// An inpainting finetune's UNet alone in the original layout (tools/goldens/sd_inpaint9.py: diffusers'
// from_single_file reads it back to the folder's UNet) on the BASE model's configs, whose UNet config says
// 4 input channels: in_channels comes from the file, as diffusers infers an inpainting file, and the image is
// the inpainting folder's (the tiny inpainting folder shares the base folder's text encoder and VAE).
TEST(StableDiffusionInpaint9, AnInpaintingSingleFileRunsOnTheBaseConfigs) {
  const GoldenFile g = golden("sd15_inpaint9_ref_a_s40");
  const std::string file =
      testing::data_path("goldens/sd_single_file/sd15_inpaint_tiny_unet_only.safetensors");
  const auto pipe = DiffusionPipeline::from_pretrained(
      file, {.single_file_config = testing::data_path("models/sd15-tiny")});
  EXPECT_STREQ(pipe->class_name(), "StableDiffusionInpaintPipeline");
  EXPECT_EQ(dynamic_cast<const UNetPipeline&>(*pipe).unet().config().in_channels, 9);
  expect_images_match((*pipe)(g.request()), g);
  // Loaded as the text-to-image class (the CLI without --init-image), it refuses the call.
  StableDiffusionPipeline sd =
      StableDiffusionPipeline::from_pretrained(testing::data_path("models/sd15-tiny"), {.single_file = file});
  PipelineRequest text = g.request();
  text.image.clear();
  text.mask_image.reset();
  text.strength.reset();
  EXPECT_KILN_ERROR(sd(text), "the UNet takes 9 input channels");
}

}  // namespace
}  // namespace kiln
