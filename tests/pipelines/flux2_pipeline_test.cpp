// Flux2Pipeline and Flux2KleinPipeline end to end against diffusers, stage by stage, on the tiny pipelines of
// tools/goldens/flux2.py, driven by the same prompt embeddings (folders saved without text encoders; the
// pipelines from a prompt are tests/pipelines/flux2_full_pipeline_test.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/core/log.h"
#include "kiln/families/flux2/flux2_pipeline.h"
#include "kiln/io/png.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/flux2_transformer.h"
#include "kiln/ops.h"
#include "support/test_data.h"

namespace kiln {
namespace {

struct GoldenCase {
  io::SafetensorsFile file;
  std::string name, pipeline;
  int64_t height, width;
  int steps, images_per_prompt;
  float guidance;
  uint64_t seed;
  bool auto_size, cfg;
  std::vector<std::string> references;

  explicit GoldenCase(const std::string& case_name)
      : file(testing::data_path("goldens/flux2/" + case_name + ".safetensors")), name(case_name) {
    const auto& m = file.metadata();
    pipeline = m.at("pipeline");
    height = std::stoll(m.at("height"));
    width = std::stoll(m.at("width"));
    steps = std::stoi(m.at("steps"));
    images_per_prompt = std::stoi(m.at("num_images_per_prompt"));
    guidance = std::stof(m.at("guidance"));
    seed = std::stoull(m.at("seed"));
    auto_size = m.at("auto_size") == "true";
    cfg = m.at("cfg") == "true";
    std::stringstream refs(m.at("references"));
    for (std::string r; std::getline(refs, r, ',');) references.push_back(r);
  }
  bool klein() const { return pipeline == "flux2-tiny-klein"; }
  std::vector<Image> images() const {
    std::vector<Image> out;
    for (const auto& r : references)
      out.push_back(Image::load(testing::data_path("goldens/flux2/" + r + ".png")));
    return out;
  }
  PipelineRequest call() const {
    PipelineRequest c;
    c.prompt_embeds = file.tensor("prompt_embeds");
    if (cfg) c.negative_prompt_embeds = file.tensor("negative_prompt_embeds");
    c.image = images();
    if (!auto_size) c.height = height;
    if (!auto_size) c.width = width;
    c.num_inference_steps = steps;
    c.guidance_scale = guidance;
    c.generator = Generator(seed);
    c.num_images_per_prompt = images_per_prompt;
    return c;
  }
};

// Both pipelines share their stages; the test loads the one the golden was made with.
std::unique_ptr<Flux2PipelineBase> load(const GoldenCase& g, DType dtype = float32) {
  PipelineLoadOptions options;
  options.dtype = dtype;
  const std::string path = testing::data_path("models/" + g.pipeline);
  if (g.klein())
    return std::make_unique<Flux2KleinPipeline>(Flux2KleinPipeline::from_pretrained(path, options));
  return std::make_unique<Flux2Pipeline>(Flux2Pipeline::from_pretrained(path, options));
}

void expect_images_match(const PipelineOutput& out, const GoldenCase& g, double min_share) {
  const Tensor expected = g.file.tensor("image_u8");
  ASSERT_EQ(static_cast<int64_t>(out.images.size()), expected.size(0)) << g.name;
  for (size_t b = 0; b < out.images.size(); ++b) {
    EXPECT_EQ(out.images[b].height, expected.size(1)) << g.name;
    EXPECT_EQ(out.images[b].width, expected.size(2)) << g.name;
    EXPECT_GE(
        testing::share_within_one_level(out.images[b].pixels, expected.select(0, static_cast<int64_t>(b))),
        min_share)
        << g.name << " image " << b;
  }
}

class Flux2PipelineFloat32 : public ::testing::TestWithParam<const char*> {};

TEST_P(Flux2PipelineFloat32, EveryStageMatchesDiffusers) {
  const GoldenCase g(GetParam());
  auto pipe = load(g);
  const int n = g.images_per_prompt;

  const auto [embeds, text_ids] = pipe->encode_prompt("", g.file.tensor("prompt_embeds"), n, 512);
  EXPECT_EQ(embeds.size(0), n);
  EXPECT_TRUE(
      testing::all_close(text_ids, g.file.tensor("transformer_in_txt_ids").select(0, 0).to(float32), 0, 0));

  Generator gen(g.seed);
  const auto [latents, latent_ids] = pipe->prepare_latents(n, g.height, g.width, float32, gen);
  EXPECT_TRUE(testing::all_close(latents, g.file.tensor("latents_init"), 0, 0))
      << "initial noise must be bit-exact";
  EXPECT_TRUE(testing::all_close(latent_ids, g.file.tensor("latent_ids").to(float32), 0, 0));

  Tensor ids = latent_ids, input = latents;
  if (!g.references.empty()) {
    std::vector<Tensor> refs;
    const std::vector<Image> images = g.images();
    for (size_t i = 0; i < images.size(); ++i) {
      refs.push_back(pipe->preprocess_image(images[i]));
      EXPECT_TRUE(testing::all_close(refs.back(), g.file.tensor("ref" + std::to_string(i) + "_pixels"), 0, 0))
          << "preprocessing of reference image " << i << " must be exact";
    }
    const auto [image_latents, image_ids] = pipe->prepare_image_latents(refs, n);
    EXPECT_TRUE(testing::rel_max_error_within(image_latents, g.file.tensor("image_latents"), 1e-4));
    EXPECT_TRUE(testing::all_close(image_ids, g.file.tensor("image_latent_ids").to(float32), 0, 0));
    ids = concat({latent_ids, image_ids}, 0);
    input = concat({latents, image_latents}, 1);
  }
  EXPECT_TRUE(
      testing::all_close(ids, g.file.tensor("transformer_in_img_ids").select(0, 0).to(float32), 0, 0));
  EXPECT_TRUE(testing::rel_max_error_within(input, g.file.tensor("transformer_in_hidden"), 1e-4));

  // The first step's prediction from the pipeline's own inputs.
  const Tensor guidance = g.klein() ? Tensor() : Tensor::full({n}, g.guidance, float32);
  const Tensor v0 = pipe->transformer().forward(input, embeds, g.file.tensor("transformer_in_timestep"),
                                                guidance, text_ids, ids);
  EXPECT_TRUE(testing::rel_max_error_within(v0, g.file.tensor("transformer_out_step0"), 1e-4));

  const Tensor image = pipe->decode_latents(g.file.tensor("latents_final"), g.height, g.width);
  EXPECT_TRUE(testing::rel_max_error_within(image, g.file.tensor("image"), 1e-4));

  // The whole call: each image equals diffusers' within one 8-bit level on at least 99% of values.
  expect_images_match((*pipe)(g.call()), g, 0.99);
}

INSTANTIATE_TEST_SUITE_P(Goldens, Flux2PipelineFloat32,
                         ::testing::Values("dev_64x64_s0", "dev_80x48_s1234", "dev_96x64_s7_n2",
                                           "dev_ref1_64x48_s3", "dev_ref2_auto_s11", "dev_ref1_48x64_s5_n2",
                                           "klein_cfg_64x64_s0", "klein_nocfg_48x80_s9",
                                           "klein_cfg_ref1_64x64_s2"));

// bfloat16: the noise is drawn in bf16 bit-exactly; the rest rounds to 8 significant bits at every op, so the
// image is held to FLUX.1's bf16 bound (tests/pipelines/flux_pipeline_test.cpp: mean difference <= 2 levels).
TEST(Flux2PipelineBfloat16, MatchesDiffusersWithinBf16Rounding) {
  for (const char* name : {"devbf16_64x64_s0", "devbf16_ref1_64x48_s3"}) {
    const GoldenCase g(name);
    auto pipe = load(g, bfloat16);
    Generator gen(g.seed);
    const Tensor latents = pipe->prepare_latents(1, g.height, g.width, bfloat16, gen).first;
    EXPECT_EQ(latents.dtype(), bfloat16);
    EXPECT_TRUE(testing::all_close(latents, g.file.tensor("latents_init"), 0, 0))
        << "bf16 noise must be bit-exact";
    const PipelineOutput out = (*pipe)(g.call());
    ASSERT_EQ(out.images.size(), 1u);
    EXPECT_LE(testing::mean_level_difference(out.images[0].pixels, g.file.tensor("image_u8").select(0, 0)),
              2.0)
        << name;
  }
}

std::string copy_with_model_index(const std::string& pipeline, const std::string& name,
                                  const std::function<void(nlohmann::json&)>& edit) {
  const std::string dir = testing::temp_dir(name);
  std::filesystem::copy(testing::data_path("models/" + pipeline), dir,
                        std::filesystem::copy_options::recursive);
  std::ifstream in(dir + "/model_index.json");
  nlohmann::json index = nlohmann::json::parse(in);
  in.close();
  edit(index);
  std::ofstream(dir + "/model_index.json") << index.dump(2);
  return dir;
}

TEST(Flux2KleinPipeline, DistilledModelsIgnoreTheGuidanceScale) {
  // is_distilled (klein 4B / 9B, not their -base variants): no classifier-free guidance, a warning, and the
  // image of a guidance scale of 1.
  const GoldenCase g("klein_cfg_64x64_s0");
  auto base = load(g);
  EXPECT_FALSE(dynamic_cast<Flux2KleinPipeline&>(*base).is_distilled());
  const std::string dir = copy_with_model_index("flux2-tiny-klein", "flux2_klein_distilled",
                                                [](auto& j) { j["is_distilled"] = true; });
  auto distilled = Flux2KleinPipeline::from_pretrained(dir);
  EXPECT_TRUE(distilled.is_distilled());
  PipelineRequest call = g.call();
  call.negative_prompt_embeds = Tensor();  // not needed without guidance
  std::vector<std::string> warnings;
  auto previous = set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  const PipelineOutput guided = distilled(call);
  set_warning_handler(previous);
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings.back().find("ignored"), std::string::npos) << warnings.back();
  call.guidance_scale = 1.0f;
  EXPECT_EQ(guided.images[0].pixels, (*base)(call).images[0].pixels);
}

TEST(Flux2Pipeline, PromptEncoderSeam) {
  // A folder without a text encoder needs prompt embeddings or an encoder of one's own; with one, `prompt`
  // gives what the same embeddings give (the negative prompt of klein's guidance is the encoder's "").
  for (const char* name : {"dev_64x64_s0", "klein_cfg_64x64_s0"}) {
    const GoldenCase g(name);
    auto pipe = load(g);
    PipelineRequest call = g.call();
    const PipelineOutput reference = (*pipe)(call);
    call.prompt_embeds = Tensor();
    call.negative_prompt_embeds = Tensor();
    call.prompt = "a photo of a cat";
    try {
      (*pipe)(call);
      ADD_FAILURE() << "a prompt without an encoder ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("prompt_embeds"), std::string::npos) << e.what();
    }
    std::vector<std::string> seen;
    pipe->set_prompt_encoder([&](const std::vector<std::string>& prompts, int64_t max_sequence_length) {
      seen.push_back(prompts.at(0));
      EXPECT_EQ(max_sequence_length, 512);
      return g.file.tensor(prompts.at(0).empty() ? "negative_prompt_embeds" : "prompt_embeds");
    });
    EXPECT_TRUE(pipe->has_prompt_encoder());
    const PipelineOutput encoded = (*pipe)(call);
    EXPECT_EQ(encoded.images[0].pixels, reference.images[0].pixels) << name;
    EXPECT_EQ(seen.size(), g.cfg ? 2u : 1u);
    EXPECT_EQ(seen.front(), "a photo of a cat");
    EXPECT_EQ(encoded.images[0].metadata.at("prompt"), "a photo of a cat");
  }
}

TEST(Flux2Pipeline, OffloadingKeepsTheImage) {
  const GoldenCase g("dev_ref1_64x48_s3");
  auto pipe = load(g);
  const PipelineOutput plain = (*pipe)(g.call());
  pipe->enable_model_cpu_offload();
  EXPECT_EQ((*pipe)(g.call()).images[0].pixels, plain.images[0].pixels);
  pipe->enable_group_offload({.blocks_per_group = 1, .prefetch = true});
  EXPECT_EQ((*pipe)(g.call()).images[0].pixels, plain.images[0].pixels);
  const OffloadPlan plan = pipe->set_memory_budget(int64_t{1} << 40);
  EXPECT_EQ(plan.mode, OffloadMode::None);
  EXPECT_EQ((*pipe)(g.call()).images[0].pixels, plain.images[0].pixels);
  EXPECT_THROW(pipe->set_memory_budget(1024), Error);  // below the largest weight
  ASSERT_EQ(pipe->components().size(), 3u);
  EXPECT_EQ(pipe->components()[0].first, "text_encoder");
  EXPECT_EQ(pipe->components()[0].second, nullptr);  // [null, null] in model_index.json
  EXPECT_EQ(pipe->components()[1].first, "transformer");
}

TEST(Flux2Pipeline, CompiledBlocksGiveDiffusersImage) {
  const GoldenCase g("dev_80x48_s1234");
  auto pipe = load(g);
  pipe->transformer().compile_repeated_blocks();
  expect_images_match((*pipe)(g.call()), g, 0.99);
}

TEST(Flux2Pipeline, SavesAPngWithTheGenerationParameters) {
  const GoldenCase g("dev_ref2_auto_s11");
  auto pipe = load(g);
  const PipelineOutput out = (*pipe)(g.call());
  ASSERT_EQ(out.images.size(), 1u);
  EXPECT_EQ(out.images[0].width, 96);  // the first reference image's size (100x64 -> 96x64)
  EXPECT_EQ(out.images[0].height, 64);
  const std::string path = testing::temp_dir("flux2_png") + "/out.png";
  out.images[0].save(path);
  const io::PngImage png = io::read_png(path);
  EXPECT_EQ(png.pixels, out.images[0].pixels);
  EXPECT_EQ(png.text.at("pipeline"), "Flux2Pipeline");
  EXPECT_EQ(png.text.at("seed"), "11");
  EXPECT_EQ(png.text.at("reference_images"), "2");
}

TEST(Flux2Pipeline, BadInputGivesClearErrors) {
  const GoldenCase g("dev_64x64_s0");
  auto pipe = load(g);
  auto expect_error = [&](PipelineRequest call, const std::string& needle) {
    try {
      (*pipe)(call);
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  PipelineRequest base = g.call();
  base.num_inference_steps = 1;
  auto c = base;
  c.height = 72;
  expect_error(c, "multiples of 16");
  c = base;
  c.num_inference_steps = 0;
  expect_error(c, "num_inference_steps");
  c = base;
  c.prompt = "x";
  expect_error(c, "not both");
  c = base;
  c.prompt_embeds = Tensor::zeros({1, 12, 47});
  expect_error(c, "prompt embeddings");
  c = base;
  c.prompt_embeds = base.prompt_embeds.to(bfloat16);
  expect_error(c, "float32");
  c = base;
  c.negative_prompt_embeds = base.prompt_embeds;
  expect_error(c, "takes no negative_prompt_embeds");
  Image tiny;
  tiny.width = 63;
  tiny.height = 80;
  tiny.pixels.assign(63 * 80 * 3, 128);
  c = base;
  c.image = {tiny};
  expect_error(c, "too small");
  Image narrow;
  narrow.width = 64;
  narrow.height = 640;
  narrow.pixels.assign(64 * 640 * 3, 128);
  c = base;
  c.image = {narrow};
  expect_error(c, "aspect ratio");
  Image broken = tiny;
  broken.pixels.resize(10);
  c = base;
  c.image = {broken};
  expect_error(c, "reference image");

  // klein with guidance needs negative embeddings (or an encoder for "").
  const GoldenCase k("klein_cfg_64x64_s0");
  auto klein = load(k);
  PipelineRequest kc = k.call();
  kc.negative_prompt_embeds = Tensor();
  try {
    (*klein)(kc);
    ADD_FAILURE() << "klein guidance without negative embeddings ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("negative_prompt_embeds"), std::string::npos) << e.what();
  }
  // The wrong pipeline class, and a folder that is not a pipeline.
  EXPECT_THROW(Flux2Pipeline::from_pretrained(testing::data_path("models/flux2-tiny-klein")), Error);
  EXPECT_THROW(Flux2KleinPipeline::from_pretrained(testing::data_path("models/flux2-tiny-dev")), Error);
  EXPECT_THROW(Flux2Pipeline::from_pretrained(testing::data_path("models/flux-tiny-dev")), Error);
  PipelineLoadOptions single_file;
  single_file.transformer_file = testing::data_path("gguf/flux-tiny-dev-Q8_0.gguf");
  EXPECT_THROW(Flux2Pipeline::from_pretrained(testing::data_path("models/flux2-tiny-dev"), single_file),
               Error);
}

TEST(Flux2Pipeline, AFolderWithoutTextEncoderLoadsThreeComponents) {
  std::vector<std::string> loaded;
  PipelineLoadOptions options;
  options.on_component_loaded = [&](const std::string& name, int, int count) {
    loaded.push_back(name);
    EXPECT_EQ(count, 3);
  };
  auto pipe = Flux2Pipeline::from_pretrained(testing::data_path("models/flux2-tiny-dev"), options);
  EXPECT_EQ(loaded, (std::vector<std::string>{"scheduler", "transformer", "vae"}));
  EXPECT_FALSE(pipe.has_prompt_encoder());
  EXPECT_EQ(pipe.prompt_encoder(), nullptr);
  // Listed text components must be there (tests/pipelines/flux2_full_pipeline_test.cpp loads real ones).
  const std::string dir = copy_with_model_index("flux2-tiny-dev", "flux2_with_text", [](auto& j) {
    j["text_encoder"] = {"transformers", "Mistral3ForConditionalGeneration"};
    j["tokenizer"] = {"transformers", "PixtralProcessor"};
  });
  try {
    Flux2Pipeline::from_pretrained(dir);
    ADD_FAILURE() << "listed components without folders loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("component folder"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
