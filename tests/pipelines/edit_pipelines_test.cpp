// The image-editing pipelines against diffusers' own (tools/goldens/edit.py): FluxImg2ImgPipeline,
// StableDiffusion3Img2ImgPipeline, FluxInpaintPipeline, StableDiffusion3InpaintPipeline and FluxFillPipeline
// on the tiny models. Stage by stage (the preprocessed image and mask, the VAE's posterior sample, the
// latents after the first step and at the end) and the image: float32 within one 8-bit level, bfloat16 within
// its noise.
#include <gtest/gtest.h>

#include <memory>
#include <optional>

#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/families/sd3/sd3_pipeline.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "pipelines/image_processor.h"
#include "pipelines/mask_crop.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct EditCase : testing::GoldenFile {
  explicit EditCase(const std::string& case_name) : GoldenFile("edit", case_name) {}
  bool kontext() const { return meta("pipeline") == "FluxKontextPipeline"; }
};

class EditPipelines : public ::testing::TestWithParam<const char*> {};

TEST_P(EditPipelines, EveryStageAndTheImageMatchDiffusers) {
  const EditCase g(GetParam());
  const bool bf16 = g.meta("dtype") == "bfloat16";
  const PipelineRequest request = g.request();

  // The preprocessing is exact: PIL's Lanczos and luma, numpy's float32 division, the binarisation.
  auto [height, width] = std::pair{*request.height, *request.width};
  if (g.kontext())
    std::tie(height, width) =
        FluxKontextPipeline::image_size(request.image.front(), request.auto_resize.value_or(true));
  // padding_mask_crop: the region diffusers found, and the image and mask cropped to it and filled.
  std::optional<pipelines::CropRegion> crop;
  if (request.padding_mask_crop) {
    crop = pipelines::mask_crop_region(*request.mask_image, width, height, *request.padding_mask_crop);
    EXPECT_EQ(std::to_string(crop->left) + "," + std::to_string(crop->top) + "," +
                  std::to_string(crop->right) + "," + std::to_string(crop->bottom),
              g.meta("crops_coords"));
  }
  const auto fitted = [&](const Image& image) {
    return crop ? pipelines::crop_and_fill(image, *crop, width, height) : image;
  };
  const Tensor init = pipelines::preprocess_image(fitted(request.image.front()), height, width);
  EXPECT_TRUE(testing::all_close(init, g["init_image"], 0, 0)) << "the preprocessed image";
  if (request.mask_image) {
    const Tensor mask =
        pipelines::preprocess_mask(fitted(*request.mask_image), *request.height, *request.width);
    EXPECT_TRUE(testing::all_close(mask, g["mask_condition"], 0, 0)) << "the preprocessed mask";
  }

  const auto pipe = g.load();
  EXPECT_EQ(pipe->class_name(), g.meta("pipeline"));
  std::vector<Tensor> steps;
  PipelineRequest traced = request;
  traced.callback_on_step_end = [&](StepState& s) { steps.push_back(s.latents.contiguous()); };
  const PipelineOutput out = (*pipe)(traced);
  ASSERT_EQ(static_cast<int>(steps.size()), std::stoi(g.meta("steps_run")));
  const double tolerance = bf16 ? 3e-2 : 2e-4;
  EXPECT_TRUE(testing::rel_max_error_within(steps.front(), g["latents_step0"], tolerance))
      << "after the first step";
  EXPECT_TRUE(testing::rel_max_error_within(steps.back(), g["latents_final"], tolerance))
      << "the final latents";
  ASSERT_EQ(out.images.size(), 1u);
  // The image's size (with padding_mask_crop: the original's, into which the result is pasted back).
  EXPECT_EQ(out.images[0].height, g["image_u8"].size(0));
  EXPECT_EQ(out.images[0].width, g["image_u8"].size(1));
  if (bf16)
    EXPECT_LE(testing::mean_level_difference(out.images[0].pixels, g["image_u8"]), 2.0);
  else
    EXPECT_LE(testing::max_level_difference(out.images[0], g["image_u8"]), 1);
  EXPECT_EQ(out.images[0].metadata.at("pipeline"), g.meta("pipeline"));
  EXPECT_EQ(out.images[0].metadata.count("strength"), g.kontext() ? 0u : 1u);
}

INSTANTIATE_TEST_SUITE_P(Goldens, EditPipelines,
                         ::testing::Values("flux_img2img_64x64_s3", "flux_img2img_schnell_48x80_s7",
                                           "flux_img2img_bf16_64x64_s2", "sd3_img2img_64x64_s5",
                                           "flux_inpaint_64x64_s4", "sd3_inpaint_64x64_s8",
                                           "flux_inpaint_crop_64x64_s6", "sd3_inpaint_crop_64x48_s12",
                                           "flux_fill_64x64_s9", "kontext_auto_s10",
                                           "kontext_own_size_48x80_s11"));

// Kontext's sizes: the output at max_area with the aspect ratio of height x width, the image at the trained
// resolution nearest its aspect ratio (ref_a, 72 x 88 -> 944 x 1104), as diffusers computes them.
TEST(EditPipelines, KontextSizes) {
  auto pipe = FluxKontextPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"));
  EXPECT_EQ(pipe.output_size({}), (std::pair<int64_t, int64_t>{1024, 1024}));
  PipelineRequest r;
  r.height = 48;
  r.width = 80;
  r.max_area = 4096;
  EXPECT_EQ(pipe.output_size(r), (std::pair<int64_t, int64_t>{48, 80}));
  const Image a = Image::load(testing::data_path("goldens/flux2/ref_a.png"));
  EXPECT_EQ(FluxKontextPipeline::image_size(a, true), (std::pair<int64_t, int64_t>{1104, 944}));
  EXPECT_EQ(FluxKontextPipeline::image_size(a, false), (std::pair<int64_t, int64_t>{80, 64}));
}

// The VAE's posterior sample draws the generator's first numbers, as DiagonalGaussianDistribution.sample; the
// pipeline then shifts and scales it (flux-tiny-dev's VAE: shift_factor 0.1159, scaling_factor 0.3611).
TEST(EditPipelines, PosteriorSampleMatchesDiffusers) {
  const EditCase g("flux_img2img_64x64_s3");
  auto pipe = FluxImg2ImgPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"));
  Generator generator(std::stoull(g.meta("seed")));
  const Tensor shifted = pipe.encode_image(g["init_image"], float32, generator);
  const Tensor expected = mul(sub(g["image_latents_sample"], 0.1159), 0.3611);
  EXPECT_TRUE(testing::rel_max_error_within(shifted, expected, 2e-4));
  Generator other(std::stoull(g.meta("seed")) + 1);
  EXPECT_FALSE(
      testing::rel_max_error_within(pipe.encode_image(g["init_image"], float32, other), expected, 1e-2))
      << "the sample must depend on the generator";
}

// Refusals name the field: a mask of another size is resized (diffusers' behaviour); a strength outside [0,
// 1], or one that leaves no step, a missing image or mask, a size that is not a multiple of 16, are errors.
TEST(EditPipelines, BadInputsAreNamed) {
  auto pipe = FluxInpaintPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"));
  const EditCase g("flux_inpaint_64x64_s4");
  PipelineRequest base = g.request();
  base.num_inference_steps = 2;
  const auto field_of = [&](PipelineRequest r) -> std::string {
    try {
      pipe(r);
    } catch (const RequestError& e) {
      return e.field();
    }
    return "(none)";
  };
  PipelineRequest r = base;
  r.strength = 1.5;
  EXPECT_EQ(field_of(r), "strength");
  r.strength = 0.0;  // no step to run
  EXPECT_EQ(field_of(r), "strength");
  r = base;
  r.mask_image.reset();
  EXPECT_EQ(field_of(r), "mask_image");
  r = base;
  r.image.clear();
  EXPECT_EQ(field_of(r), "image");
  r = base;
  r.height = 72;
  EXPECT_EQ(field_of(r), "height");
  // A mask of another size than the image is resized to the call's size, as diffusers does.
  r = base;
  r.mask_image = Image::load(testing::data_path("goldens/edit/mask_soft.png"));
  EXPECT_EQ(pipe(r).images.at(0).width, 64);
  // padding_mask_crop: a pad of at least 0, a mask of the image's size with something to repaint, images as
  // the output (it pastes them back).
  r = base;
  r.padding_mask_crop = -1;
  EXPECT_EQ(field_of(r), "padding_mask_crop");
  r.padding_mask_crop = 4;
  r.mask_image = Image::load(testing::data_path("goldens/edit/mask_soft.png"));  // 100x64, the image 72x88
  EXPECT_EQ(field_of(r), "mask_image");
  r.mask_image = Image{.width = 72, .height = 88, .channels = 1, .pixels = std::vector<uint8_t>(72 * 88, 0)};
  EXPECT_EQ(field_of(r), "mask_image") << "an all-black mask: nothing to repaint, no region to crop";
  r = base;
  r.padding_mask_crop = 4;
  r.output_type = OutputType::Array;
  EXPECT_EQ(field_of(r), "output_type");
  r.output_type = OutputType::Image;
  const Image cropped = pipe(r).images.at(0);
  EXPECT_EQ(cropped.width, 72);
  EXPECT_EQ(cropped.height, 88);
  EXPECT_EQ(cropped.metadata.at("padding_mask_crop"), "4");
  auto img2img = FluxImg2ImgPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"));
  r = base;
  r.mask_image.reset();
  r.padding_mask_crop = 4;
  try {
    img2img(r);
    ADD_FAILURE() << "padding_mask_crop accepted by FluxImg2ImgPipeline";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "padding_mask_crop");
  }
  // Text-to-image refuses the editing fields, naming the pipelines that take them.
  auto text = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"));
  PipelineRequest t{.prompt = "x", .height = 32, .width = 32, .num_inference_steps = 1};
  t.strength = 0.5;
  try {
    text(t);
    ADD_FAILURE() << "strength accepted by FluxPipeline";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "strength");
    EXPECT_NE(std::string(e.what()).find("FluxImg2ImgPipeline"), std::string::npos) << e.what();
  }
}

// Editing pipelines load their text-to-image siblings' folders, as diffusers lets them, and Fill refuses a
// transformer that does not take the masked image and the mask.
TEST(EditPipelines, LoadTheFoldersTheyShareAndRefuseTheOthers) {
  EXPECT_STREQ(FluxImg2ImgPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev")).class_name(),
               "FluxImg2ImgPipeline");
  EXPECT_STREQ(StableDiffusion3InpaintPipeline::from_pretrained(testing::data_path("models/sd3-tiny-medium"))
                   .class_name(),
               "StableDiffusion3InpaintPipeline");
  EXPECT_THROW(FluxFillPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev")), Error);
  EXPECT_THROW(FluxInpaintPipeline::from_pretrained(testing::data_path("models/sd3-tiny-medium")), Error);
  EXPECT_STREQ(DiffusionPipeline::from_pretrained(testing::data_path("models/flux-tiny-fill"))->class_name(),
               "FluxFillPipeline");
}

// diffusers' from_pipe: the image-to-image and inpainting classes made from a loaded text-to-image pipeline
// share its components (nothing is loaded again) and give diffusers' image; the source still runs, and
// adapters loaded through either are the other's.
TEST(EditPipelines, FromPipeSharesTheComponentsAndGivesTheSameImage) {
  for (const char* name : {"flux_img2img_64x64_s3", "sd3_inpaint_64x64_s8"}) {
    const EditCase g(name);
    const PipelineClass& target = pipeline_class(g.meta("pipeline"), name);
    const std::string folder = testing::data_path("models/" + g.meta("model"));
    const std::unique_ptr<DiffusionPipeline> source = DiffusionPipeline::from_pretrained(folder);
    ASSERT_FALSE(source->registered_class().edits_an_image()) << name;
    const std::unique_ptr<DiffusionPipeline> sibling = pipeline_from_pipe(target, *source);
    EXPECT_EQ(sibling->class_name(), g.meta("pipeline"));
    const auto components = source->components();
    const auto shared = sibling->components();
    ASSERT_EQ(components.size(), shared.size());
    for (size_t i = 0; i < components.size(); ++i)
      EXPECT_EQ(components[i].second, shared[i].second) << name << ": " << components[i].first;
    const PipelineOutput out = (*sibling)(g.request());
    ASSERT_EQ(out.images.size(), 1u);
    EXPECT_LE(testing::max_level_difference(out.images[0], g["image_u8"]), 1) << name;
    EXPECT_EQ(out.images[0].metadata.at("pipeline"), g.meta("pipeline"));
    // The source runs its own task still (and refuses the sibling's fields).
    PipelineRequest text = g.request();
    text.image.clear();
    text.mask_image.reset();
    text.strength.reset();
    text.padding_mask_crop.reset();
    EXPECT_EQ((*source)(text).images.size(), 1u);
    EXPECT_THROW(source->check_request(g.request()), RequestError);
    // And back: the text-to-image class from the sibling.
    const auto back = pipeline_from_pipe(source->registered_class(), *sibling);
    EXPECT_EQ(back->class_name(), source->registered_class().name);
  }
  // The typed form.
  FluxPipeline flux = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"));
  EXPECT_STREQ(FluxInpaintPipeline::from_pipe(flux).class_name(), "FluxInpaintPipeline");
  EXPECT_EQ(&FluxImg2ImgPipeline::from_pipe(flux).transformer(), &flux.transformer());
}

// A class that loads its own checkpoint (Fill, Kontext), or one of another family, is refused by name.
TEST(EditPipelines, FromPipeRefusesTheClassesOfOtherFolders) {
  const auto flux = DiffusionPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"));
  for (const char* name : {"FluxFillPipeline", "FluxKontextPipeline", "StableDiffusion3Img2ImgPipeline"}) {
    try {
      pipeline_from_pipe(pipeline_class(name, ""), *flux);
      ADD_FAILURE() << name << " was made from a FluxPipeline";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(name) + " cannot be made from a FluxPipeline"),
                std::string::npos)
          << e.what();
    }
  }
  // The sibling a folder runs for an image: its inpainting class with a mask, image-to-image without.
  EXPECT_EQ(class_for_images(flux->registered_class(), true).name, "FluxInpaintPipeline");
  EXPECT_EQ(class_for_images(flux->registered_class(), false).name, "FluxImg2ImgPipeline");
  EXPECT_EQ(class_for_images(pipeline_class("FluxFillPipeline", ""), true).name, "FluxFillPipeline");
  try {
    class_for_images(pipeline_class("ChromaPipeline", ""), true);
    ADD_FAILURE() << "Chroma has no inpainting class";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "mask_image");
    EXPECT_NE(std::string(e.what()).find("has no inpainting pipeline"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
