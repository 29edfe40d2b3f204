// The SDXL refiner and SDXL's time ids against diffusers 0.42 (tools/goldens/sd_refiner.py): the refiner's
// folder (no first text tower, an aesthetic score in the time ids) through image-to-image and inpainting, and
// the base's negative time ids, whose rules differ by class; the refiner as one file in Stability's layout.
// Each golden's script checks that its image moves when the tested value changes, so a misread id fails here.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kiln/families/stable_diffusion/stable_diffusion_xl_pipeline.h"
#include "kiln/ops.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "nlohmann/json.hpp"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::expect_images_match;
using testing::GoldenFile;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

class SdxlTimeIds : public ::testing::TestWithParam<const char*> {};

TEST_P(SdxlTimeIds, MatchDiffusers) {
  const GoldenFile g("sd_refiner", GetParam());
  const std::unique_ptr<DiffusionPipeline> loaded = g.load();
  const PipelineRequest request = g.text_request();
  auto& pipe = dynamic_cast<StableDiffusionXLPipeline&>(*loaded);
  EXPECT_EQ(pipe.requires_aesthetics_score(), g.meta("model").find("refiner") != std::string::npos);
  const auto e = pipe.encode_prompt({request.prompt}, {request.prompt_2.value_or(request.prompt)});
  EXPECT_TRUE(testing::rel_max_error_within(e.prompt_embeds, g["prompt_embeds"].narrow(0, 0, 1), 1e-5))
      << g.name;
  EXPECT_TRUE(
      testing::rel_max_error_within(e.pooled_prompt_embeds, g["pooled_prompt_embeds"].narrow(0, 0, 1), 1e-5))
      << g.name;
  PipelineRequest call = request;
  Tensor first_step;
  call.callback_on_step_end = [&](StepState& s) {  // the first step run (image-to-image starts later)
    if (!first_step.defined()) first_step = s.latents.to(float32);
  };
  expect_images_match((*loaded)(call), g);
  EXPECT_TRUE(testing::rel_max_error_within(first_step, g["latents_step0"], 1e-4)) << g.name;
}

INSTANTIATE_TEST_SUITE_P(Goldens, SdxlTimeIds,
                         ::testing::Values("refiner_img2img_ref_a_s0", "refiner_img2img_scores_ref_b_s1",
                                           "refiner_inpaint_ref_a_s2", "base_img2img_crops_ref_a_s3",
                                           "base_txt2img_negcrop_32x32_s4",
                                           "base_txt2img_one_negative_size_32x32_s5"));

TEST(SdxlRefiner, Bfloat16StaysWithinItsNoise) {
  const GoldenFile g("sd_refiner", "refiner_img2img_bf16_ref_a_s0");
  const PipelineOutput out = (*g.load())(g.text_request());
  const double mean = testing::mean_level_difference(out.images[0].pixels, g["image_u8"].select(0, 0));
  std::printf("[ levels   ] refiner bf16: mean %.3f vs diffusers\n", mean);
  EXPECT_LE(mean, 2.0);
}

// The refiner's folder loads as diffusers loads it: the image-to-image class from its model_index.json, the
// inpainting sibling on request; the text-to-image class is refused naming what to run instead, at load and
// through from_pipe.
TEST(SdxlRefiner, TextToImageIsRefusedByName) {
  const std::string folder = testing::data_path("models/sdxl-refiner-tiny");
  const auto pipe = DiffusionPipeline::from_pretrained(folder);
  EXPECT_STREQ(pipe->class_name(), "StableDiffusionXLImg2ImgPipeline");
  std::string error = error_of([&] { StableDiffusionXLPipeline::from_pretrained(folder); });
  EXPECT_NE(error.find("an SDXL refiner"), std::string::npos) << error;
  EXPECT_NE(error.find("StableDiffusionXLImg2ImgPipeline"), std::string::npos) << error;
  auto& refiner = dynamic_cast<StableDiffusionXLPipeline&>(*pipe);
  StableDiffusionXLPipeline text_to_image = StableDiffusionXLPipeline::from_pipe(refiner);
  error = error_of([&] { text_to_image({.prompt = "a cat", .height = 32, .width = 32}); });
  EXPECT_NE(error.find("refines an image"), std::string::npos) << error;
  // Out of the refiner's range (LAION's aesthetic scores, 0 to 10): refused naming the field.
  PipelineRequest call = GoldenFile("sd_refiner", "refiner_img2img_ref_a_s0").text_request();
  call.aesthetic_score = 11.0f;
  error = error_of([&] { (*pipe)(call); });
  EXPECT_NE(error.find("aesthetic_score"), std::string::npos) << error;
}

// The refiner's folder names its image-to-image class; given a mask, its inpainting sibling runs it (as
// kiln generate --init-image --mask and kiln serve pick).
TEST(SdxlRefiner, AMaskPicksTheInpaintingSibling) {
  const PipelineClass& folder = pipeline_class("StableDiffusionXLImg2ImgPipeline", "");
  EXPECT_EQ(class_for_images(folder, true).name, "StableDiffusionXLInpaintPipeline");
  EXPECT_EQ(class_for_images(folder, false).name, "StableDiffusionXLImg2ImgPipeline");
  EXPECT_EQ(class_for_images(pipeline_class("StableDiffusionXLInpaintPipeline", ""), false).name,
            "StableDiffusionXLInpaintPipeline");
}

// The refiner as one file in Stability's layout (tools/goldens/sd_single_file.py writes the tiny refiner so
// and checks diffusers' from_single_file reads it back to every tensor), given as the model on the refiner
// folder's configs: the folder's class and diffusers' image. diffusers' default configs for it are the
// refiner's repo.
TEST(SdxlRefiner, ASingleFileGivesTheFoldersImage) {
  const std::string file = testing::data_path("goldens/sd_single_file/sdxl_refiner_tiny.safetensors");
  const std::string folder = testing::data_path("models/sdxl-refiner-tiny");
  const SingleFilePipeline found = single_file_pipeline(file);
  EXPECT_EQ(found.pipeline_class, "StableDiffusionXLImg2ImgPipeline");
  EXPECT_EQ(found.default_config, "stabilityai/stable-diffusion-xl-refiner-1.0");
  const GoldenFile g("sd_refiner", "refiner_img2img_ref_a_s0");
  ASSERT_EQ(g.meta("model"), "sdxl-refiner-tiny");
  const auto pipe = DiffusionPipeline::from_pretrained(file, {.single_file_config = folder});
  EXPECT_STREQ(pipe->class_name(), "StableDiffusionXLImg2ImgPipeline");
  EXPECT_TRUE(dynamic_cast<StableDiffusionXLPipeline&>(*pipe).requires_aesthetics_score());
  const PipelineOutput out = (*pipe)(g.text_request());
  expect_images_match(out, g);
  EXPECT_EQ(out.images[0].metadata.at("model"), file);
}

// A refiner file on a base's configs, and a base file on the refiner's, are refused naming the file, the
// folder and what each is, whichever class is asked for.
TEST(SdxlRefiner, AFileOnTheOtherKindsConfigsIsRefusedNamingBoth) {
  const std::string refiner_file = testing::data_path("goldens/sd_single_file/sdxl_refiner_tiny.safetensors");
  const std::string base_file = testing::data_path("goldens/sd_single_file/sdxl_tiny.safetensors");
  const std::string refiner = testing::data_path("models/sdxl-refiner-tiny");
  const std::string base = testing::data_path("models/sdxl-tiny");
  std::string error =
      error_of([&] { DiffusionPipeline::from_pretrained(refiner_file, {.single_file_config = base}); });
  EXPECT_NE(error.find(refiner_file + ": an SDXL refiner checkpoint, but " + base), std::string::npos)
      << error;
  EXPECT_NE(error.find("is an SDXL base (model_index.json: requires_aesthetics_score false)"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("--config stabilityai/stable-diffusion-xl-refiner-1.0"), std::string::npos) << error;
  error = error_of([&] { StableDiffusionXLPipeline::from_pretrained(base, {.single_file = refiner_file}); });
  EXPECT_NE(error.find("an SDXL refiner checkpoint, but " + base), std::string::npos) << error;
  // The base's file asks for its text-to-image class: told the folder is the refiner, not that the refiner's
  // text-to-image class is refused.
  error = error_of([&] { DiffusionPipeline::from_pretrained(base_file, {.single_file_config = refiner}); });
  EXPECT_NE(error.find(base_file + ": an SDXL base checkpoint, but " + refiner), std::string::npos) << error;
  EXPECT_NE(error.find("is an SDXL refiner (model_index.json: requires_aesthetics_score true)"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("--config stabilityai/stable-diffusion-xl-base-1.0"), std::string::npos) << error;
  error = error_of(
      [&] { StableDiffusionXLImg2ImgPipeline::from_pretrained(refiner, {.single_file = base_file}); });
  EXPECT_NE(error.find("an SDXL base checkpoint, but " + refiner), std::string::npos) << error;
}

// A folder whose requires_aesthetics_score disagrees with its UNet's added-condition width is refused before
// any call, naming the key and the value to set, both ways.
TEST(SdxlRefiner, AMismatchedRequiresAestheticsScoreIsRefusedByName) {
  namespace fs = std::filesystem;
  for (const auto& [model, flag] : {std::pair{"sdxl-refiner-tiny", false}, {"sdxl-tiny", true}}) {
    const fs::path copy = testing::temp_dir(std::string("refiner_flag_") + model);
    fs::remove_all(copy);
    fs::copy(testing::data_path(std::string("models/") + model), copy, fs::copy_options::recursive);
    nlohmann::json index;
    std::ifstream(copy / "model_index.json") >> index;
    index["requires_aesthetics_score"] = flag;
    std::ofstream(copy / "model_index.json") << index.dump(2);
    const std::string error =
        error_of([&] { StableDiffusionXLImg2ImgPipeline::from_pretrained(copy.string()); });
    EXPECT_NE(error.find("requires_aesthetics_score is " + std::string(flag ? "true" : "false")),
              std::string::npos)
        << model << ": " << error;
    EXPECT_NE(error.find(std::string("set requires_aesthetics_score to ") + (flag ? "false" : "true")),
              std::string::npos)
        << model << ": " << error;
  }
}

}  // namespace
}  // namespace kiln
