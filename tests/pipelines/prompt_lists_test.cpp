// Prompt lists (diffusers' prompt=[...]): one call makes num_images_per_prompt images of each prompt, their
// noise drawn as one batch; generator lists (generator=[...]): image i's noise from generator i; and a
// generator that has already drawn numbers, continued and handed back where torch's would be. Against
// diffusers' FluxPipeline (with true CFG), StableDiffusion3Pipeline (with CFG), Flux2KleinPipeline (CFG) and
// Flux2Pipeline (tools/goldens/prompt_lists.py): every image within one 8-bit level (float32) and the final
// latents. Also the checks of the lists and each image's metadata.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/io/safetensors.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "pipelines/call_control.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

class PromptLists : public ::testing::TestWithParam<const char*> {};

TEST_P(PromptLists, EveryImageMatchesDiffusers) {
  const testing::GoldenFile g("prompt_lists", GetParam());
  const auto pipe = g.load();
  const PipelineRequest request = g.request();
  Tensor final_latents;
  PipelineRequest traced = request;
  traced.callback_on_step_end = [&](StepState& s) { final_latents = s.latents.contiguous(); };
  const PipelineOutput out = (*pipe)(traced);
  EXPECT_TRUE(testing::rel_max_error_within(final_latents, g.file.tensor("latents_final"), 2e-4));
  const Tensor want = g.file.tensor("image_u8");
  ASSERT_EQ(static_cast<int64_t>(out.images.size()), want.size(0));
  const size_t n = static_cast<size_t>(request.num_images_per_prompt);
  for (size_t i = 0; i < out.images.size(); ++i) {
    EXPECT_LE(testing::max_level_difference(out.images[i], want.select(0, static_cast<int64_t>(i))), 1)
        << "image " << i;
    // Each image names its own prompt (and negative prompt) and seed.
    if (!request.prompt_embeds.defined()) {
      EXPECT_EQ(out.images[i].metadata.at("prompt"),
                request.prompts.empty() ? request.prompt : request.prompts[i / n])
          << "image " << i;
    }
    if (!request.generators.empty()) {
      EXPECT_EQ(out.images[i].metadata.at("seed"), std::to_string(request.generators[i].initial_seed()));
    }
    if (!request.negative_prompts.empty()) {
      EXPECT_EQ(out.images[i].metadata.at("negative_prompt"), request.negative_prompts[i / n])
          << "image " << i;
    }
  }
  // The images differ from prompt to prompt, or generator to generator.
  if (out.images.size() > 1) {
    EXPECT_NE(out.images.front().pixels, out.images.back().pixels);
  }
  // The generators come back where torch's are after the same call.
  if (g.file.contains("generator_state_after")) {
    ASSERT_TRUE(out.generator.has_value());
    EXPECT_EQ(out.generator->torch_state(), g.file.tensor("generator_state_after").to_vector<uint8_t>());
  }
  EXPECT_EQ(out.generators.size(), request.generators.size());
}

INSTANTIATE_TEST_SUITE_P(Goldens, PromptLists,
                         ::testing::Values("flux_dev_2x2_s31", "flux_dev_true_cfg_s32", "sd3_cfg_2x2_s33",
                                           "klein_cfg_3x1_s34", "flux2_dev_2x1_s35",
                                           "flux_dev_generators_1x3", "sd3_generators_2x1",
                                           "flux2_dev_generators_1x2", "flux_dev_drawn_generator",
                                           "flux_dev_embeds_s44", "sd3_embeds_s45", "flux_img2img_lists",
                                           "flux_inpaint_lists", "kontext_lists", "sd3_inpaint_lists"));

// Embeddings given instead of a prompt: encode_prompt's own output gives the prompt's image, bit for bit;
// each row makes num_images_per_prompt images; shapes and companions are checked by name.
TEST(PromptEmbeddings, EncodePromptsOutputGivesThePromptsImage) {
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"));
  PipelineRequest r = testing::small_request();
  r.num_images_per_prompt = 2;
  r.generator = Generator(6);
  const PipelineOutput by_prompt = pipe(r);
  const auto e = pipe.encode_prompt(r.prompt, std::nullopt, 1, 16);
  PipelineRequest by_embeds = r;
  by_embeds.prompt.clear();
  by_embeds.prompt_embeds = e.prompt_embeds;
  by_embeds.pooled_prompt_embeds = e.pooled_prompt_embeds;
  const PipelineOutput out = pipe(by_embeds);
  ASSERT_EQ(out.images.size(), 2u);
  EXPECT_EQ(out.images[0].pixels, by_prompt.images[0].pixels);
  EXPECT_EQ(out.images[1].pixels, by_prompt.images[1].pixels);
  EXPECT_EQ(out.images[0].metadata.count("prompt"), 0u);

  const auto expect_error = [&](PipelineRequest bad, const std::string& field, const std::string& words) {
    try {
      pipe(bad);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const RequestError& err) {
      EXPECT_EQ(err.field(), field) << err.what();
      EXPECT_NE(std::string(err.what()).find(words), std::string::npos) << err.what();
    }
  };
  PipelineRequest bad = by_embeds;
  bad.pooled_prompt_embeds = Tensor();
  expect_error(bad, "pooled_prompt_embeds", "prompt_embeds needs pooled_prompt_embeds");
  bad = by_embeds;
  bad.prompt_embeds = Tensor::zeros({1, 16, 7});
  expect_error(bad, "prompt_embeds", "must be floating point [B, L, 32]");
  bad = by_embeds;
  bad.pooled_prompt_embeds = Tensor::zeros({2, 32});
  expect_error(bad, "pooled_prompt_embeds", "must be floating point [1, 32]");
  bad = by_embeds;
  bad.prompt = "a cat";
  expect_error(bad, "prompt_embeds", "either prompt or prompt_embeds");
  bad = by_embeds;
  bad.negative_prompt_embeds = Tensor::zeros({2, 16, 32});
  bad.negative_pooled_prompt_embeds = Tensor::zeros({2, 32});
  expect_error(bad, "negative_prompt_embeds", "has 2 rows for 1 prompts");
  PipelineRequest pooled_alone = r;
  pooled_alone.pooled_prompt_embeds = e.pooled_prompt_embeds;
  expect_error(pooled_alone, "pooled_prompt_embeds", "go with prompt_embeds");
  PipelineRequest flux2;
  flux2.pooled_prompt_embeds = e.pooled_prompt_embeds;
  testing::expect_refused("Flux2Pipeline", flux2, "pooled_prompt_embeds", "takes no pooled_prompt_embeds");
}

// With a generator per image, image i is the image its generator makes alone; a call continued with the
// generator it handed back makes the next images of the stream, as two diffusers calls with one
// torch.Generator do.
TEST(GeneratorLists, EachImageIsItsGeneratorsOwnAndGeneratorsContinue) {
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"));
  const PipelineRequest r = testing::small_request();
  PipelineRequest listed = r;
  listed.num_images_per_prompt = 2;
  listed.generators = {Generator(7), Generator(8)};
  const PipelineOutput both = pipe(listed);
  ASSERT_EQ(both.images.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    PipelineRequest alone = r;
    alone.generator = Generator(7 + i);
    EXPECT_EQ(pipe(alone).images[0].pixels, both.images[i].pixels) << "image " << i;
  }
  // Two calls of one image each, the second from the generator the first handed back, make the batch of two
  // that one call with that seed makes (the noise is one stream).
  PipelineRequest first = r;
  first.output_type = OutputType::Latent;
  first.generator = Generator(5);
  const PipelineOutput one = pipe(first);
  ASSERT_TRUE(one.generator.has_value());
  PipelineRequest second = first;
  second.generator = *one.generator;
  const PipelineOutput two = pipe(second);
  PipelineRequest batch = first;
  batch.num_images_per_prompt = 2;
  const Tensor both_latents = pipe(batch).latents;
  EXPECT_TRUE(testing::rel_max_error_within(one.latents, both_latents.narrow(0, 0, 1), 1e-5));
  EXPECT_TRUE(testing::rel_max_error_within(two.latents, both_latents.narrow(0, 1, 1), 1e-5));
  EXPECT_FALSE(pipe(r).generator.has_value());  // no generator given, none handed back
}

// A list of one prompt is that prompt: the same image, bit for bit; and a negative_prompt string applies to
// every prompt of a list, as negative_prompts of copies of it.
TEST(PromptListRules, OnePromptListIsThePromptAndOneNegativeIsEveryPromptsOwn) {
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"));
  PipelineRequest single = testing::small_request();
  single.generator = Generator(9);
  PipelineRequest listed = single;
  listed.prompt.clear();
  listed.prompts = {"a photo of a cat"};
  EXPECT_EQ(pipe(listed).images[0].pixels, pipe(single).images[0].pixels);

  PipelineRequest shared = listed;
  shared.prompts = {"a photo of a cat", "a red fox"};
  shared.negative_prompt = "blurry";
  shared.true_cfg_scale = 3.0f;
  PipelineRequest each = shared;
  each.negative_prompt.reset();
  each.negative_prompts = {"blurry", "blurry"};
  const PipelineOutput a = pipe(shared), b = pipe(each);
  ASSERT_EQ(a.images.size(), 2u);
  EXPECT_EQ(a.images[1].pixels, b.images[1].pixels);
  EXPECT_EQ(a.images[1].metadata.at("negative_prompt"), "blurry");
}

TEST(PromptListRules, BadListsAreRefusedByName) {
  PipelineRequest two;
  two.prompts = {"a", "b"};
  PipelineRequest r = two;
  r.prompt = "c";
  testing::expect_refused("FluxPipeline", r, "prompt", "either prompt or a list of prompts");
  r = two;
  r.negative_prompts = {"x"};
  testing::expect_refused("StableDiffusion3Pipeline", r, "negative_prompts",
                          "1 negative prompts for 2 prompts");
  r = two;
  r.negative_prompts = {"x", "y"};
  r.negative_prompt = "z";
  testing::expect_refused("Flux2KleinPipeline", r, "negative_prompts", "either negative_prompt");
  r = two;
  r.prompt_2 = "t5";
  testing::expect_refused("FluxPipeline", r, "prompt_2", "every text encoder reads them");
  r = two;
  r.num_images_per_prompt = 33;
  testing::expect_refused("FluxPipeline", r, "prompts",
                          "2 prompts x 33 images each make 66 images, more than the maximum 64");
  PipelineRequest alone;
  alone.prompt = "a";
  alone.negative_prompts = {"x"};
  testing::expect_refused("FluxPipeline", alone, "negative_prompts", "go with a list of prompts");
  // The editing pipelines take lists too; SD3's refuse a generator list (diffusers' encode image[i] with
  // generator[i] for each image of the batch, which their one input image does not have).
  r = two;
  r.image = {Image()};
  EXPECT_NO_THROW(pipeline_class("FluxImg2ImgPipeline", "").check_fields(r));
  r.mask_image = Image();
  EXPECT_NO_THROW(pipeline_class("StableDiffusion3InpaintPipeline", "").check_fields(r));
  // Generator lists: one per image, not beside generator.
  r = two;
  r.generators = {Generator(1), Generator(2), Generator(3)};
  testing::expect_refused("FluxPipeline", r, "generators", "3 generators for 2 images");
  r.generators = {Generator(1), Generator(2)};
  r.generator = Generator(4);
  testing::expect_refused("StableDiffusion3Pipeline", r, "generators",
                          "either generator or a list of generators");
  PipelineRequest edit;
  edit.generators = {Generator(1), Generator(2)};
  edit.num_images_per_prompt = 2;
  edit.image = {Image()};
  EXPECT_NO_THROW(pipeline_class("FluxImg2ImgPipeline", "").check_fields(edit));
  testing::expect_refused("StableDiffusion3Img2ImgPipeline", edit, "generators",
                          "StableDiffusion3Img2ImgPipeline takes no generators");
  // Tensor-parallel ranks tell two lists apart.
  PipelineRequest other = two;
  other.prompts = {"a", "c"};
  EXPECT_NE(pipelines::request_key(two), pipelines::request_key(other));
}

}  // namespace
}  // namespace kiln
