// FluxPipeline end to end against diffusers, stage by stage, on the tiny pipelines of tools/goldens/flux.py.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "kiln/core/log.h"
#include "kiln/families/flux1/flux_pipeline.h"
#include "kiln/io/png.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/flux_transformer.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct GoldenCase {
  io::SafetensorsFile file;
  std::string pipeline, prompt;
  int64_t height, width, max_sequence_length;
  int steps;
  float guidance;
  uint64_t seed;

  explicit GoldenCase(const std::string& name)
      : file(testing::data_path("goldens/flux/" + name + ".safetensors")) {
    const auto& m = file.metadata();
    pipeline = m.at("pipeline");
    prompt = m.at("prompt");
    height = std::stoll(m.at("height"));
    width = std::stoll(m.at("width"));
    steps = std::stoi(m.at("steps"));
    guidance = std::stof(m.at("guidance"));
    seed = std::stoull(m.at("seed"));
    max_sequence_length = std::stoll(m.at("max_sequence_length"));
  }
  PipelineRequest call() const {
    PipelineRequest c;
    c.prompt = prompt;
    c.height = height;
    c.width = width;
    c.num_inference_steps = steps;
    c.guidance_scale = guidance;
    c.generator = Generator(seed);
    c.max_sequence_length = max_sequence_length;
    return c;
  }
};

std::vector<int64_t> ids_of(const Tensor& t) {
  return t.to_vector<int64_t>();
}

class FluxPipelineFloat32 : public ::testing::TestWithParam<const char*> {};

TEST_P(FluxPipelineFloat32, EveryStageMatchesDiffusers) {
  const GoldenCase g(GetParam());
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/" + g.pipeline));

  const auto prompt = pipe.encode_prompt(g.prompt, std::nullopt, 1, g.max_sequence_length);
  EXPECT_EQ(prompt.clip_ids, ids_of(g.file.tensor("clip_ids")));
  EXPECT_EQ(prompt.t5_ids, ids_of(g.file.tensor("t5_ids")));
  EXPECT_TRUE(testing::rel_max_error_within(prompt.prompt_embeds, g.file.tensor("prompt_embeds"), 1e-4));
  EXPECT_TRUE(testing::rel_max_error_within(prompt.pooled_prompt_embeds,
                                            g.file.tensor("pooled_prompt_embeds"), 1e-4));

  Generator gen(g.seed);
  const auto [latents, image_ids] = pipe.prepare_latents(1, g.height, g.width, float32, gen);
  EXPECT_TRUE(testing::all_close(latents, g.file.tensor("latents_init"), 0, 0))
      << "initial noise must be bit-exact";

  Tensor guidance;
  if (pipe.transformer().config().guidance_embeds) guidance = g.file.tensor("transformer_in_guidance");
  const Tensor v0 = pipe.transformer().forward(
      latents, g.file.tensor("prompt_embeds"), g.file.tensor("pooled_prompt_embeds"),
      g.file.tensor("transformer_in_timestep"), guidance, prompt.text_ids, image_ids);
  EXPECT_TRUE(testing::rel_max_error_within(v0, g.file.tensor("transformer_out_step0"), 1e-4));

  const Tensor image = pipe.decode_latents(g.file.tensor("latents_final"), g.height, g.width);
  EXPECT_TRUE(testing::rel_max_error_within(image.select(0, 0), g.file.tensor("image"), 1e-4));

  // The whole call: the final image equals diffusers' within one 8-bit level on at least 99% of values.
  const PipelineOutput out = pipe(g.call());
  ASSERT_EQ(out.images.size(), 1u);
  EXPECT_EQ(out.images[0].width, g.width);
  EXPECT_EQ(out.images[0].height, g.height);
  EXPECT_GE(testing::share_within_one_level(out.images[0].pixels, g.file.tensor("image_u8")), 0.99);
}

INSTANTIATE_TEST_SUITE_P(Goldens, FluxPipelineFloat32,
                         ::testing::Values("schnell_cat_64x64_s0", "schnell_unicode_64x96_s42",
                                           "schnell_long_96x64_s7", "dev_cat_64x64_s0",
                                           "dev_unicode_80x48_s1234"));

// bfloat16: the noise is drawn in bf16 bit-exactly; the rest rounds to 8 significant bits at every op (as
// diffusers' bf16 run does, but not always at the same points), so the latents after 3 steps agree to a few
// bf16 ulps of their range and the 8-bit image to within a few levels.
TEST(FluxPipelineBfloat16, MatchesDiffusersWithinBf16Rounding) {
  const GoldenCase g("devbf16_cat_64x64_s0");
  PipelineLoadOptions options;
  options.dtype = bfloat16;
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/" + g.pipeline), options);
  Generator gen(g.seed);
  const auto [latents, image_ids] = pipe.prepare_latents(1, g.height, g.width, bfloat16, gen);
  EXPECT_EQ(latents.dtype(), bfloat16);
  EXPECT_TRUE(testing::all_close(latents, g.file.tensor("latents_init"), 0, 0))
      << "bf16 noise must be bit-exact";
  const PipelineOutput out = pipe(g.call());
  EXPECT_LE(testing::mean_level_difference(out.images[0].pixels, g.file.tensor("image_u8")), 2.0)
      << "mean absolute difference in 8-bit levels";
}

// A diffusers folder whose transformer holds its Linear weights in float8_e4m3fn (tools/gguf_refs/
// fp8_single_file.py): Kiln keeps them fp8 and gives diffusers' image (which widens them to bf16 on load),
// within the bf16 bound above.
TEST(FluxPipelineBfloat16, Fp8TransformerFolderMatchesDiffusers) {
  namespace fs = std::filesystem;
  const fs::path folder = fs::path(testing::temp_dir("flux_fp8_folder")) / "flux-tiny-dev-fp8";
  fs::remove_all(folder);
  fs::copy(testing::data_path("models/flux-tiny-dev-bf16"), folder, fs::copy_options::recursive);
  fs::remove_all(folder / "transformer");
  fs::copy(testing::data_path("gguf/flux-tiny-dev-fp8-transformer"), folder / "transformer",
           fs::copy_options::recursive);
  PipelineLoadOptions options;
  options.dtype = bfloat16;
  auto pipe = FluxPipeline::from_pretrained(folder.string(), options);
  int kept = 0;
  for (const auto& [name, t] : pipe.transformer().named_parameters())
    kept += t->defined() && t->dtype() == uint8;
  EXPECT_EQ(kept, 50);  // every Linear weight of the tiny transformer (q, k, v apart, unlike the BFL file)
  PipelineRequest call;
  call.prompt = "cat";
  call.height = call.width = 64;
  call.num_inference_steps = 3;
  call.guidance_scale = 3.5f;
  call.generator = Generator(0);
  call.max_sequence_length = 32;
  const PipelineOutput out = pipe(call);
  const io::SafetensorsFile goldens(testing::data_path("gguf/fp8_single_file_goldens.safetensors"));
  const double mean =
      testing::mean_level_difference(out.images[0].pixels, goldens.tensor("fp8_pipeline_image_u8"));
  std::printf("[ levels   ] fp8 transformer folder: mean %.3f vs diffusers\n", mean);
  EXPECT_LE(mean, 2.0) << "mean absolute difference in 8-bit levels";
}

// The README's example, word for word but for the model and the size.
TEST(FluxPipeline, ReadmeExampleRuns) {
  auto pipe = kiln::FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-schnell"),
                                                  {.dtype = kiln::bfloat16});
  auto result = pipe({.prompt = "a golden retriever surfing a wave, photorealistic",
                      .height = 32,
                      .width = 32,
                      .num_inference_steps = 4,
                      .guidance_scale = 0.0f,
                      .generator = kiln::Generator(0)});
  const std::string path = testing::temp_dir("flux_readme") + "/output.png";
  result.images[0].save(path);
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(io::read_png(path).text.at("dtype"), "bfloat16");
}

TEST(FluxPipeline, LongPromptIsTruncatedWithAWarning) {
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-schnell"));
  std::vector<std::string> warnings;
  auto previous = set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  const auto p = pipe.encode_prompt(std::string(400, 'a') + " b c d e f g", std::nullopt, 1, 16);
  set_warning_handler(previous);
  EXPECT_EQ(p.t5_ids.size(), 16u);
  EXPECT_EQ(p.t5_ids.back(), 1);  // </s> kept last
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings.back().find("truncated"), std::string::npos);
}

TEST(FluxPipeline, SavesAnAtomicPngWithTheGenerationParameters) {
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-schnell"));
  PipelineRequest call;
  call.prompt = "a photo of a cat";
  call.height = 32;
  call.width = 48;
  call.num_inference_steps = 2;
  call.generator = Generator(5);
  call.max_sequence_length = 16;
  const auto out = pipe(call);
  const std::string path = testing::temp_dir("flux_png") + "/out.png";
  out.images[0].save(path);
  const io::PngImage png = io::read_png(path);
  EXPECT_EQ(png.width, 48);
  EXPECT_EQ(png.height, 32);
  EXPECT_EQ(png.pixels, out.images[0].pixels);
  EXPECT_EQ(png.text.at("prompt"), "a photo of a cat");
  EXPECT_EQ(png.text.at("seed"), "5");
  // A failing save leaves nothing behind.
  EXPECT_THROW(out.images[0].save(testing::temp_dir("flux_png_dir")), Error);
}

TEST(FluxPipeline, BadInputGivesClearErrors) {
  auto pipe = FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-schnell"));
  auto expect_error = [&](PipelineRequest call, const std::string& needle) {
    try {
      pipe(call);
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  PipelineRequest base;
  base.prompt = "x";
  base.height = 64;
  base.width = 64;
  base.num_inference_steps = 1;
  auto c = base;
  c.height = 72;
  expect_error(c, "multiples of 16");
  c = base;
  c.num_inference_steps = 0;
  expect_error(c, "num_inference_steps");
  c = base;
  c.max_sequence_length = 513;
  expect_error(c, "max_sequence_length");
  EXPECT_THROW(FluxPipeline::from_pretrained(testing::data_path("models/flux-tiny-schnell/transformer")),
               Error);
  EXPECT_THROW(FluxPipeline::from_pretrained(testing::data_path("models/tiny-dit")), Error);
}

TEST(FluxPipeline, MissingComponentIsNamed) {
  const std::string dir = testing::temp_dir("flux_missing");
  std::filesystem::copy(testing::data_path("models/flux-tiny-schnell"), dir,
                        std::filesystem::copy_options::recursive);
  std::filesystem::remove_all(dir + "/vae");
  try {
    FluxPipeline::from_pretrained(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vae"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
