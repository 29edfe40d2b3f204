// ChromaPipeline and ChromaImg2ImgPipeline against diffusers 0.42, stage by stage and image by image, on the
// tiny pipelines of tools/goldens/chroma.py (tools/goldens/chroma_notes.md says what each stage does): T5
// with its padding mask, the transformer's mask with one padding token kept (added to the scores, as
// diffusers does), the approximator's modulation, real classifier-free guidance, prompt lists,
// image-to-image, bfloat16, a LoRA and the single-file transformer.
#include <gtest/gtest.h>

#include "kiln/families/chroma/chroma_pipeline.h"
#include "kiln/families/chroma/chroma_transformer.h"
#include "kiln/ops.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

using testing::expect_images_match;
using testing::GoldenFile;

std::unique_ptr<ChromaPipeline> load_chroma(const GoldenFile& g, PipelineLoadOptions options = {}) {
  options.dtype = g.meta("dtype") == "bfloat16" ? bfloat16 : float32;
  const std::string folder = testing::data_path("models/" + g.meta("model"));
  if (g.meta("pipeline") == "ChromaImg2ImgPipeline")
    return std::make_unique<ChromaImg2ImgPipeline>(ChromaImg2ImgPipeline::from_pretrained(folder, options));
  return std::make_unique<ChromaPipeline>(ChromaPipeline::from_pretrained(folder, options));
}

class ChromaFloat32 : public ::testing::TestWithParam<const char*> {};

TEST_P(ChromaFloat32, EveryStageMatchesDiffusers) {
  const GoldenFile g("chroma", GetParam());
  const auto pipe = load_chroma(g);
  PipelineRequest request = g.request();
  request.negative_prompt_embeds = Tensor();  // the default negative prompt ("") where none was recorded
  const int n = request.num_images_per_prompt;
  const int64_t tokens = *request.max_sequence_length;

  // T5 over the prompt's tokens only, and the transformer's mask keeping one padding token more.
  const auto prompt = pipe->encode_prompt(
      request.prompts.empty() ? std::vector<std::string>{request.prompt} : request.prompts, n, tokens);
  EXPECT_TRUE(testing::rel_max_error_within(prompt.prompt_embeds, g["prompt_embeds"], 1e-5)) << g.name;
  EXPECT_TRUE(testing::all_close(prompt.attention_mask, g["prompt_attention_mask"], 0, 0)) << g.name;
  EXPECT_TRUE(testing::all_close(prompt.text_ids, g["text_ids"], 0, 0)) << g.name;

  // The approximator: its input and every block's modulation from the first step's timestep.
  const models::ChromaTransformer2DModel& transformer = pipe->transformer();
  const Tensor t0 = g["transformer_in_timestep"];
  EXPECT_TRUE(testing::all_close(transformer.approximator_input(t0), g["approximator_in_step0"], 1e-6, 1e-6))
      << g.name;
  EXPECT_TRUE(testing::rel_max_error_within(transformer.modulations(t0), g["approximator_out_step0"], 1e-5))
      << g.name;

  // The first prediction from diffusers' inputs: the float mask added to the scores (not a boolean mask).
  const Tensor v0 = transformer.forward(g["latents_init"], g["prompt_embeds"], t0, g["text_ids"],
                                        g["latent_image_ids"], g["attention_mask"]);
  EXPECT_TRUE(testing::rel_max_error_within(v0, g["transformer_out_step0"], 1e-4)) << g.name;
  if (g.file.contains("transformer_out_step0_bool_mask")) {
    EXPECT_FALSE(testing::rel_max_error_within(v0, g["transformer_out_step0_bool_mask"], 1e-2));
  }
  if (g.file.contains("negative_prompt_embeds")) {
    const Tensor negative =
        transformer.forward(g["latents_init"], g["negative_prompt_embeds"], t0, g["text_ids"],
                            g["latent_image_ids"], g["negative_attention_mask"]);
    EXPECT_TRUE(testing::rel_max_error_within(negative, g["transformer_out_step0_negative"], 1e-4)) << g.name;
  }

  // The whole call.
  const PipelineOutput out = (*pipe)(request);
  expect_images_match(out, g);
  EXPECT_EQ(out.images[0].metadata.at("pipeline"), g.meta("pipeline"));
}

INSTANTIATE_TEST_SUITE_P(Goldens, ChromaFloat32,
                         ::testing::Values("cfg_cat_64x64_s0", "cfg_fox_64x64_s0", "nocfg_cat_64x64_s0",
                                           "images2_unicode_64x64_s42", "list_64x64_s5", "long_48x80_s7",
                                           "img2img_64x64_s3"));

TEST(ChromaPipeline, ThePromptChangesTheImage) {
  const GoldenFile cat("chroma", "cfg_cat_64x64_s0"), fox("chroma", "cfg_fox_64x64_s0");
  const auto pipe = load_chroma(cat);
  const PipelineOutput a = (*pipe)(cat.request()), b = (*pipe)(fox.request());
  EXPECT_GT(testing::max_level_difference(a.images[0], b.images[0]), 16);
}

TEST(ChromaPipeline, Bfloat16StaysWithinItsNoise) {
  const GoldenFile g("chroma", "bf16_cat_64x64_s0");
  const auto pipe = load_chroma(g);
  ASSERT_EQ(pipe->dtype(), bfloat16);
  const PipelineOutput out = (*pipe)(g.request());
  // diffusers' bf16 image is 2.4 levels from its float32 one on average (its noise); Kiln's, which rounds the
  // same ops, 0.8 from diffusers' on this host.
  EXPECT_LE(testing::mean_level_difference(out.images[0].pixels, g["image_u8"].select(0, 0)), 1.2);
}

TEST(ChromaPipeline, TheSingleFileTransformerGivesTheFoldersImage) {
  const GoldenFile g("chroma", "cfg_cat_64x64_s0");
  // As lodestones ship it: the original names, read off the file's shapes beside the folder's config.
  const auto pipe = load_chroma(
      g, {.transformer_file = testing::data_path("goldens/chroma/transformer_single_file.safetensors")});
  expect_images_match((*pipe)(g.request()), g);
  const auto from_file = models::ChromaTransformer2DModel::from_single_file(
      testing::data_path("goldens/chroma/transformer_single_file.safetensors"),
      {.config = testing::data_path("models/chroma-tiny/transformer"), .dtype = float32});
  EXPECT_EQ(from_file->config().modulation_rows(), 32);
}

// A GGUF of that file (tools/gguf_refs/chroma_gguf.py: Linear weights in Q8_0, as the community quantizes
// Chroma): the weights stay quantized, and the image is diffusers' from the same file
// (from_single_file with GGUFQuantizationConfig), every stage within the f32 bounds above.
TEST(ChromaPipeline, AGgufQ8_0TransformerGivesDiffusersImage) {
  const GoldenFile g("chroma", "gguf_q8_0_cat_64x64_s0");
  const auto pipe = load_chroma(
      g, {.transformer_file = testing::data_path("goldens/chroma/transformer_single_file-Q8_0.gguf")});
  int quantized = 0;
  for (const auto& [name, t] : pipe->transformer().named_parameters())
    quantized += t->defined() && t->dtype() == uint8;
  EXPECT_EQ(quantized, 23 + 4 * (3 - 1) + 2 * (4 - 1));  // the file's 23, fused qkv and linear1 split
  const PipelineOutput out = (*pipe)(g.request());
  expect_images_match(out, g);
  // And the quantization shows: the image is not the f32 transformer's.
  const GoldenFile f32("chroma", "cfg_cat_64x64_s0");
  EXPECT_GT(testing::mean_level_difference(out.images[0].pixels, f32["image_u8"].select(0, 0)), 0.2);
}

TEST(ChromaPipeline, ALoraInDiffusersNamesGivesDiffusersImage) {
  const GoldenFile base("chroma", "cfg_cat_64x64_s0"), g("chroma", "lora_diffusers");
  const auto pipe = load_chroma(base);
  pipe->load_lora_weights(testing::data_path("lora/chroma_diffusers.safetensors"), {.adapter_name = "a"});
  const PipelineOutput out = (*pipe)(base.request());
  EXPECT_GE(testing::share_within_one_level(out.images[0].pixels, g["image_u8"]), 0.99);
  // Without it, the base image.
  pipe->unload_lora_weights();
  expect_images_match((*pipe)(base.request()), base);
}

TEST(ChromaPipeline, RefusesWhatItDoesNotTake) {
  PipelineRequest r = testing::small_request();
  r.prompt_2 = "t5 prompt";
  testing::expect_refused("ChromaPipeline", r, "prompt_2", "ChromaPipeline takes no prompt_2");
  r = testing::small_request();
  r.true_cfg_scale = 4.0f;
  testing::expect_refused("ChromaPipeline", r, "true_cfg_scale", "ChromaPipeline takes no true_cfg_scale");
  r = testing::small_request();
  r.prompt = "";
  r.prompt_embeds = Tensor::zeros({1, 16, 32}, float32);
  testing::expect_refused("ChromaPipeline", r, "prompt_embeds", "ChromaPipeline takes no prompt_embeds");
  r = testing::small_request();
  r.strength = 0.5;
  testing::expect_refused("ChromaPipeline", r, "strength", "ChromaImg2ImgPipeline");
}

}  // namespace
}  // namespace kiln
