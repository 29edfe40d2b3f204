// Prompt lists (diffusers' prompt=[...]): one call makes num_images_per_prompt images of each prompt, their
// noise drawn as one batch, against diffusers' FluxPipeline (with true CFG), StableDiffusion3Pipeline (with
// CFG), Flux2KleinPipeline (CFG) and Flux2Pipeline (tools/goldens/prompt_lists.py): every image within one
// 8-bit level (float32) and the final latents. Also the checks of the lists and each image's metadata.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "kiln/io/safetensors.h"
#include "kiln/pipelines/flux_pipeline.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "pipelines/call_control.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct ListCase {
  io::SafetensorsFile file;
  std::string name;

  explicit ListCase(const std::string& case_name)
      : file(testing::data_path("goldens/prompt_lists/" + case_name + ".safetensors")), name(case_name) {}
  const std::string& meta(const std::string& key) const { return file.metadata().at(key); }
  bool has(const std::string& key) const { return file.metadata().count(key) > 0; }
  std::vector<std::string> list(const std::string& key) const {
    return nlohmann::json::parse(meta(key)).get<std::vector<std::string>>();
  }

  PipelineRequest request() const {
    PipelineRequest r;
    r.prompts = list("prompt");
    if (has("negative_prompt")) r.negative_prompts = list("negative_prompt");
    if (has("true_cfg_scale")) r.true_cfg_scale = std::stof(meta("true_cfg_scale"));
    if (has("num_images_per_prompt")) r.num_images_per_prompt = std::stoi(meta("num_images_per_prompt"));
    r.height = std::stoll(meta("height"));
    r.width = std::stoll(meta("width"));
    r.num_inference_steps = std::stoi(meta("num_inference_steps"));
    r.guidance_scale = std::stof(meta("guidance_scale"));
    r.max_sequence_length = std::stoll(meta("max_sequence_length"));
    r.generator = Generator(std::stoull(meta("seed")));
    return r;
  }
  std::unique_ptr<DiffusionPipeline> load() const {
    return pipeline_class(meta("pipeline"), name).load(testing::data_path("models/" + meta("model")), {});
  }
};

class PromptLists : public ::testing::TestWithParam<const char*> {};

TEST_P(PromptLists, EveryImageMatchesDiffusers) {
  const ListCase g(GetParam());
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
    const std::vector<uint8_t> expected = want.select(0, static_cast<int64_t>(i)).to_vector<uint8_t>();
    ASSERT_EQ(out.images[i].pixels.size(), expected.size());
    int worst = 0;
    for (size_t k = 0; k < expected.size(); ++k)
      worst = std::max(worst,
                       std::abs(static_cast<int>(out.images[i].pixels[k]) - static_cast<int>(expected[k])));
    EXPECT_LE(worst, 1) << "image " << i;
    // Each image names its own prompt (and negative prompt).
    EXPECT_EQ(out.images[i].metadata.at("prompt"), request.prompts[i / n]) << "image " << i;
    if (!request.negative_prompts.empty()) {
      EXPECT_EQ(out.images[i].metadata.at("negative_prompt"), request.negative_prompts[i / n])
          << "image " << i;
    }
  }
  // The images differ from prompt to prompt (the list is not one prompt repeated).
  EXPECT_NE(out.images.front().pixels, out.images.back().pixels);
}

INSTANTIATE_TEST_SUITE_P(Goldens, PromptLists,
                         ::testing::Values("flux_dev_2x2_s31", "flux_dev_true_cfg_s32", "sd3_cfg_2x2_s33",
                                           "klein_cfg_3x1_s34", "flux2_dev_2x1_s35"));

// A list of one prompt is that prompt: the same image, bit for bit; and a negative_prompt string applies to
// every prompt of a list, as negative_prompts of copies of it.
TEST(PromptListRules, OnePromptListIsThePromptAndOneNegativeIsEveryPromptsOwn) {
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-dev"));
  PipelineRequest single;
  single.prompt = "a photo of a cat";
  single.height = 32;
  single.width = 32;
  single.num_inference_steps = 2;
  single.max_sequence_length = 16;
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

void expect_refused(const std::string& pipeline, PipelineRequest r, const std::string& field,
                    const std::string& words) {
  try {
    pipeline_class(pipeline, "").check_fields(r);
    ADD_FAILURE() << pipeline << " took the request";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(PromptListRules, BadListsAreRefusedByName) {
  PipelineRequest two;
  two.prompts = {"a", "b"};
  PipelineRequest r = two;
  r.prompt = "c";
  expect_refused("FluxPipeline", r, "prompt", "either prompt or a list of prompts");
  r = two;
  r.negative_prompts = {"x"};
  expect_refused("StableDiffusion3Pipeline", r, "negative_prompts", "1 negative prompts for 2 prompts");
  r = two;
  r.negative_prompts = {"x", "y"};
  r.negative_prompt = "z";
  expect_refused("Flux2KleinPipeline", r, "negative_prompts", "either negative_prompt");
  r = two;
  r.prompt_2 = "t5";
  expect_refused("FluxPipeline", r, "prompt_2", "every text encoder reads them");
  r = two;
  r.num_images_per_prompt = 33;
  expect_refused("FluxPipeline", r, "prompts",
                 "2 prompts x 33 images each make 66 images, more than the maximum 64");
  PipelineRequest alone;
  alone.prompt = "a";
  alone.negative_prompts = {"x"};
  expect_refused("FluxPipeline", alone, "negative_prompts", "go with a list of prompts");
  // The editing pipelines take one prompt.
  r = two;
  r.image = {Image()};
  expect_refused("FluxImg2ImgPipeline", r, "prompts", "FluxImg2ImgPipeline takes one prompt per call");
  r.mask_image = Image();
  expect_refused("StableDiffusion3InpaintPipeline", r, "prompts", "takes one prompt per call");
  r = two;
  expect_refused("FluxKontextPipeline", r, "prompts", "FluxKontextPipeline takes one prompt per call");
  // Tensor-parallel ranks tell two lists apart.
  PipelineRequest other = two;
  other.prompts = {"a", "c"};
  EXPECT_NE(pipelines::request_key(two), pipelines::request_key(other));
}

}  // namespace
}  // namespace kiln
