// StableDiffusion3Pipeline against diffusers, stage by stage and end to end, on the tiny pipelines of
// tools/goldens/sd3.py (a 3.5 Medium-like one with dual attention, a Large-like one without).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/core/log.h"
#include "kiln/families/sd3/sd3_pipeline.h"
#include "kiln/io/png.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/sd3_transformer.h"
#include "support/pipeline_comparison.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct GoldenCase {
  io::SafetensorsFile file;
  std::string pipeline;
  PipelineRequest call;
  bool cfg = false;
  DType dtype = float32;

  explicit GoldenCase(const std::string& name)
      : file(testing::data_path("goldens/sd3/" + name + ".safetensors")) {
    const auto& m = file.metadata();
    pipeline = m.at("pipeline");
    call = testing::request_from_golden(file);
    if (m.count("skip_guidance_layers")) {
      std::stringstream layers(m.at("skip_guidance_layers"));
      for (std::string l; std::getline(layers, l, ',');)
        call.skip_layer_guidance.layers.push_back(std::stoll(l));
      call.skip_layer_guidance.scale = std::stod(m.at("skip_layer_guidance_scale"));
      call.skip_layer_guidance.start = std::stod(m.at("skip_layer_guidance_start"));
      call.skip_layer_guidance.stop = std::stod(m.at("skip_layer_guidance_stop"));
    }
    cfg = m.at("cfg") == "true";
    dtype = m.at("dtype") == "bfloat16" ? bfloat16 : float32;
  }
  Tensor operator[](const std::string& name) const { return file.tensor(name); }
};

std::vector<int64_t> ids_of(const Tensor& t) {
  return t.to_vector<int64_t>();
}

StableDiffusion3Pipeline load(const GoldenCase& g) {
  PipelineLoadOptions options;
  options.dtype = g.dtype;
  return StableDiffusion3Pipeline::from_pretrained(testing::data_path("models/" + g.pipeline), options);
}

void expect_text_matches(const StableDiffusion3Pipeline::TextEmbeddings& e, const GoldenCase& g,
                         const std::string& prefix, double tol) {
  EXPECT_EQ(e.clip_l_ids, ids_of(g[prefix + "clip_l_ids"]));
  EXPECT_EQ(e.clip_g_ids, ids_of(g[prefix + "clip_g_ids"]));
  EXPECT_EQ(e.t5_ids, ids_of(g[prefix + "t5_ids"]));
  const std::string embeds = prefix.empty() ? "" : "negative_";
  EXPECT_TRUE(testing::rel_max_error_within(e.prompt_embeds, g[embeds + "prompt_embeds"], tol)) << prefix;
  EXPECT_TRUE(testing::rel_max_error_within(e.pooled_prompt_embeds, g[embeds + "pooled_prompt_embeds"], tol))
      << prefix;
}

class SD3PipelineFloat32 : public ::testing::TestWithParam<const char*> {};

TEST_P(SD3PipelineFloat32, EveryStageMatchesDiffusers) {
  const GoldenCase g(GetParam());
  auto pipe = load(g);

  // Each encoder's output (CLIP penultimate hidden states and projected pooled vectors, T5), then the
  // combined embeddings of the prompt and, with guidance, of the negative prompt.
  const auto prompt = pipe.encode_prompt(g.call);
  const auto& pos = prompt.positive;
  EXPECT_TRUE(testing::rel_max_error_within(pos.clip_l_hidden, g["clip_l_hidden"], 1e-4));
  EXPECT_TRUE(testing::rel_max_error_within(pos.clip_l_pooled, g["clip_l_pooled"], 1e-4));
  EXPECT_TRUE(testing::rel_max_error_within(pos.clip_g_hidden, g["clip_g_hidden"], 1e-4));
  EXPECT_TRUE(testing::rel_max_error_within(pos.clip_g_pooled, g["clip_g_pooled"], 1e-4));
  EXPECT_TRUE(testing::rel_max_error_within(pos.t5_hidden, g["t5_hidden"], 1e-4));
  expect_text_matches(pos, g, "", 1e-4);
  ASSERT_EQ(prompt.negative.has_value(), g.cfg);
  if (g.cfg) expect_text_matches(*prompt.negative, g, "negative_", 1e-4);

  Generator gen(g.call.generator->initial_seed());
  const Tensor latents = pipe.prepare_latents(1, *g.call.height, *g.call.width, float32, gen);
  EXPECT_TRUE(testing::all_close(latents, g["latents_init"], 0, 0)) << "initial noise must be bit-exact";

  // The first step's velocity (the batch-2 transformer pass combined with the guidance scale), from
  // diffusers' own embeddings so that this stage is checked on its own.
  StableDiffusion3Pipeline::PromptEmbeddings reference = prompt;
  reference.positive.prompt_embeds = g["prompt_embeds"];
  reference.positive.pooled_prompt_embeds = g["pooled_prompt_embeds"];
  if (g.cfg) {
    reference.negative->prompt_embeds = g["negative_prompt_embeds"];
    reference.negative->pooled_prompt_embeds = g["negative_pooled_prompt_embeds"];
  }
  const float t0 = g["transformer_in_timestep"].to_vector<float>()[0];
  const Tensor v0 = pipe.predict_velocity(g["latents_init"], t0, 0, reference, g.call);
  EXPECT_TRUE(testing::rel_max_error_within(v0, g["guided_velocity_step0"], 1e-4));

  const Tensor image = pipe.decode_latents(g["latents_final"]);
  EXPECT_TRUE(testing::rel_max_error_within(image.select(0, 0), g["image"], 1e-4));

  // The whole call: the final image equals diffusers' within one 8-bit level on at least 99% of values.
  const PipelineOutput out = pipe(g.call);
  ASSERT_EQ(out.images.size(), 1u);
  EXPECT_EQ(out.images[0].width, g.call.width);
  EXPECT_EQ(out.images[0].height, g.call.height);
  EXPECT_GE(testing::share_within_one_level(out.images[0].pixels, g["image_u8"]), 0.99);
}

INSTANTIATE_TEST_SUITE_P(Goldens, SD3PipelineFloat32,
                         ::testing::Values("medium_cat_64x64_s0", "medium_nocfg_64x48_s3",
                                           "medium_slg_48x64_s5", "large_unicode_80x48_s7",
                                           "large_long_64x64_s11"));

TEST(SD3Pipeline, SkipLayerGuidanceChangesTheSteps) {
  // In medium_slg (5 steps, start 0.01, stop 0.6) skip-layer guidance acts at steps 1 and 2 only: at step 0
  // the velocity equals the one without it, at step 1 it differs.
  const GoldenCase g("medium_slg_48x64_s5");
  auto pipe = load(g);
  const auto prompt = pipe.encode_prompt(g.call);
  PipelineRequest plain = g.call;
  plain.skip_layer_guidance.layers.clear();
  const Tensor x = g["latents_step0"];
  const float t1 = g["sigmas"].to_vector<float>()[1] * 1000.0f;
  EXPECT_TRUE(testing::all_close(pipe.predict_velocity(x, t1, 0, prompt, g.call),
                                 pipe.predict_velocity(x, t1, 0, prompt, plain), 0, 0));
  EXPECT_FALSE(testing::rel_max_error_within(pipe.predict_velocity(x, t1, 1, prompt, g.call),
                                             pipe.predict_velocity(x, t1, 1, prompt, plain), 1e-3));
}

// bfloat16 (the float32 checkpoints converted on load, as diffusers' .to(torch.bfloat16)): the noise is drawn
// in bf16 bit-exactly; the rest rounds to 8 significant bits at every op as diffusers' bf16 run does, though
// not always the same way where kernels sum in another order, so the stages agree to a few bf16 ulps of their
// range and the 8-bit image to within a few levels.
class SD3PipelineBfloat16 : public ::testing::TestWithParam<const char*> {};

TEST_P(SD3PipelineBfloat16, MatchesDiffusersWithinBf16Rounding) {
  const GoldenCase g(GetParam());
  ASSERT_EQ(g.dtype, bfloat16);
  auto pipe = load(g);
  const auto prompt = pipe.encode_prompt(g.call);
  EXPECT_EQ(prompt.positive.prompt_embeds.dtype(), bfloat16);
  // Two bf16 ulps (2^-7 relative to the range): the encoders are 2-3 layers deep.
  expect_text_matches(prompt.positive, g, "", 2e-2);
  if (g.cfg) expect_text_matches(*prompt.negative, g, "negative_", 2e-2);

  Generator gen(g.call.generator->initial_seed());
  const Tensor latents = pipe.prepare_latents(1, *g.call.height, *g.call.width, bfloat16, gen);
  EXPECT_EQ(latents.dtype(), bfloat16);
  EXPECT_TRUE(testing::all_close(latents, g["latents_init"], 0, 0)) << "bf16 noise must be bit-exact";

  const PipelineOutput out = pipe(g.call);
  EXPECT_LE(testing::mean_level_difference(out.images[0].pixels, g["image_u8"]), 2.0)
      << "mean absolute difference in 8-bit levels";
}

INSTANTIATE_TEST_SUITE_P(Goldens, SD3PipelineBfloat16,
                         ::testing::Values("mediumbf16_cat_64x64_s0", "largebf16_unicode_80x48_s7"));

TEST(SD3Pipeline, DefaultsFollowDiffusers) {
  auto pipe = StableDiffusion3Pipeline::from_pretrained(testing::data_path("models/sd3-tiny-medium"));
  const PipelineDefaults defaults = pipe.defaults();
  EXPECT_EQ(defaults.num_inference_steps, 28);
  EXPECT_EQ(defaults.guidance_scale, 7.0f);
  EXPECT_EQ(defaults.max_sequence_length, 256);
  EXPECT_EQ(defaults.height, 64);
  EXPECT_EQ(defaults.width, 64);
  EXPECT_TRUE(PipelineRequest().skip_layer_guidance.layers.empty());
  EXPECT_EQ(pipe.default_image_size(), 64);  // sample_size 8 x VAE factor 8
  // An absent negative prompt is the empty string, not zeros; prompt_2/3 fall back to the prompt.
  PipelineRequest call;
  call.prompt = "a photo of a cat";
  call.max_sequence_length = 16;
  const auto p = pipe.encode_prompt(call);
  ASSERT_TRUE(p.negative.has_value());
  const auto empty = pipe.encode_text("", "", "", 1, 16);
  EXPECT_TRUE(testing::all_close(p.negative->prompt_embeds, empty.prompt_embeds, 0, 0));
  EXPECT_EQ(p.negative->clip_g_ids[2], 0);  // CLIP-G pads with "!" = 0 right after <|endoftext|>
  // The CLIP features are zero-padded to T5's width: columns from 24 + 32 = 56 on are 0 in the 77 CLIP rows.
  const Tensor pad = p.positive.prompt_embeds.narrow(1, 0, 77).narrow(2, 56, 8);
  EXPECT_TRUE(testing::all_close(pad, Tensor::zeros(pad.shape()), 0, 0));
  // Guidance <= 1 encodes no negative prompt.
  call.guidance_scale = 1.0f;
  EXPECT_FALSE(pipe.encode_prompt(call).negative.has_value());
  // Several images per prompt repeat the embeddings.
  call.num_images_per_prompt = 2;
  const auto two = pipe.encode_prompt(call);
  EXPECT_EQ(two.positive.prompt_embeds.size(0), 2);
  EXPECT_TRUE(testing::all_close(two.positive.prompt_embeds.narrow(0, 1, 1), p.positive.prompt_embeds, 0, 0));
}

TEST(SD3Pipeline, SavesThePngWithTheGenerationParameters) {
  auto pipe = StableDiffusion3Pipeline::from_pretrained(testing::data_path("models/sd3-tiny-large"));
  auto result = pipe({.prompt = "a red circle",
                      .negative_prompt = "blurry",
                      .height = 32,
                      .width = 48,
                      .num_inference_steps = 2,
                      .guidance_scale = 4.5f,
                      .generator = Generator(5),
                      .max_sequence_length = 16,
                      .num_images_per_prompt = 2});
  ASSERT_EQ(result.images.size(), 2u);
  const std::string path = testing::temp_dir("sd3_png") + "/out.png";
  result.images[1].save(path);
  const io::PngImage png = io::read_png(path);
  EXPECT_EQ(png.width, 48);
  EXPECT_EQ(png.height, 32);
  EXPECT_EQ(png.pixels, result.images[1].pixels);
  EXPECT_EQ(png.text.at("pipeline"), "StableDiffusion3Pipeline");
  EXPECT_EQ(png.text.at("negative_prompt"), "blurry");
  EXPECT_EQ(png.text.at("seed"), "5");
}

TEST(SD3Pipeline, BadInputGivesClearErrors) {
  auto pipe = StableDiffusion3Pipeline::from_pretrained(testing::data_path("models/sd3-tiny-medium"));
  auto expect_error = [&](PipelineRequest call, const std::string& needle) {
    try {
      pipe(call);
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("StableDiffusion3Pipeline"), std::string::npos) << e.what();
    }
  };
  PipelineRequest base;
  base.prompt = "x";
  base.num_inference_steps = 1;
  auto c = base;
  c.height = 72;
  expect_error(c, "multiples of 16");
  c = base;
  c.width = 512;  // 32 patches; the tiny table holds 16
  expect_error(c, "position table");
  c = base;
  c.num_inference_steps = 0;
  expect_error(c, "num_inference_steps");
  c = base;
  c.max_sequence_length = 513;
  expect_error(c, "max_sequence_length");
  c = base;
  c.skip_layer_guidance.layers = {3};
  expect_error(c, "skip_guidance_layers");
  c = base;
  c.guidance_scale = -1.0f;
  expect_error(c, "guidance_scale");
  EXPECT_THROW(StableDiffusion3Pipeline::from_pretrained(testing::data_path("models/flux-tiny-schnell")),
               Error);
  EXPECT_THROW(
      StableDiffusion3Pipeline::from_pretrained(testing::data_path("models/sd3-tiny-medium/transformer")),
      Error);
}

TEST(SD3Pipeline, MissingComponentIsNamedAndT5IsOptional) {
  const std::string dir = testing::temp_dir("sd3_missing");
  std::filesystem::copy(testing::data_path("models/sd3-tiny-medium"), dir,
                        std::filesystem::copy_options::recursive);
  std::filesystem::remove_all(dir + "/vae");
  try {
    StableDiffusion3Pipeline::from_pretrained(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vae"), std::string::npos) << e.what();
  }
  // Without T5 ([null, null] in model_index.json) its embeddings are zeros, as diffusers makes them.
  const std::string no_t5 = testing::temp_dir("sd3_no_t5");
  std::filesystem::copy(testing::data_path("models/sd3-tiny-medium"), no_t5,
                        std::filesystem::copy_options::recursive);
  std::filesystem::remove_all(no_t5 + "/text_encoder_3");
  std::filesystem::remove_all(no_t5 + "/tokenizer_3");
  std::string index;
  {
    std::ifstream in(no_t5 + "/model_index.json");
    index.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (const char* key : {"\"text_encoder_3\"", "\"tokenizer_3\""}) {
    const size_t at = index.find(key);
    ASSERT_NE(at, std::string::npos);
    const size_t open = index.find('[', at), close = index.find(']', at);
    index.replace(open, close - open + 1, "[null, null]");
  }
  std::ofstream(no_t5 + "/model_index.json") << index;
  auto pipe = StableDiffusion3Pipeline::from_pretrained(no_t5);
  const auto e = pipe.encode_text("a cat", "a cat", "a cat", 1, 16);
  EXPECT_TRUE(e.t5_ids.empty());
  EXPECT_EQ(e.prompt_embeds.shape(), (Shape{1, 77 + 16, 64}));
  const Tensor t5 = e.prompt_embeds.narrow(1, 77, 16);
  EXPECT_TRUE(testing::all_close(t5, Tensor::zeros(t5.shape()), 0, 0));
}

}  // namespace
}  // namespace kiln
