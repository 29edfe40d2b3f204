// Flux2Pipeline and Flux2KleinPipeline end to end from a prompt, as diffusers' pipe(prompt=...) runs them, on
// the tiny FULL pipelines of tools/goldens/flux2_e2e.py (Mistral 3 + PixtralProcessor, Qwen3 + its tokenizer,
// with the transformer and VAE): the text encoder's token ids, the prompt embeddings the transformer
// receives (and klein's negative ones) and the image, for Unicode, empty and truncated prompts, several sizes
// and seeds, reference images and klein's classifier-free guidance.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/log.h"
#include "kiln/families/flux2/flux2_pipeline.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/flux2_prompt_encoder.h"
#include "kiln/models/flux2_transformer.h"
#include "support/test_data.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

struct FullCase {
  io::SafetensorsFile file;
  std::string name, pipeline, prompt, negative_prompt;
  DType dtype;
  int64_t height, width, max_sequence_length;
  int steps, images_per_prompt;
  float guidance;
  uint64_t seed;
  bool cfg;
  std::vector<std::string> references;

  explicit FullCase(const std::string& case_name)
      : file(testing::data_path("goldens/flux2_e2e/" + case_name + ".safetensors")), name(case_name) {
    const auto& m = file.metadata();
    pipeline = m.at("pipeline");
    prompt = m.at("prompt");
    negative_prompt = m.at("negative_prompt");
    dtype = m.at("dtype") == "bf16" ? bfloat16 : float32;
    height = std::stoll(m.at("height"));
    width = std::stoll(m.at("width"));
    max_sequence_length = std::stoll(m.at("max_sequence_length"));
    steps = std::stoi(m.at("steps"));
    images_per_prompt = std::stoi(m.at("num_images_per_prompt"));
    guidance = std::stof(m.at("guidance"));
    seed = std::stoull(m.at("seed"));
    cfg = m.at("cfg") == "true";
    std::stringstream refs(m.at("references"));
    for (std::string r; std::getline(refs, r, ',');) references.push_back(r);
  }
  bool klein() const { return pipeline == "flux2-tiny-klein-full"; }
  std::string folder() const { return testing::data_path("models/" + pipeline); }
  PipelineRequest call() const {
    PipelineRequest c;
    c.prompt = prompt;
    c.negative_prompt = negative_prompt;
    for (const auto& r : references)
      c.image.push_back(Image::load(testing::data_path("goldens/flux2/" + r + ".png")));
    if (height != 0) c.height = height;  // 0 in the case: the first reference image's size
    if (width != 0) c.width = width;
    c.num_inference_steps = steps;
    c.guidance_scale = guidance;
    c.generator = Generator(seed);
    c.num_images_per_prompt = images_per_prompt;
    c.max_sequence_length = max_sequence_length;
    return c;
  }
};

std::unique_ptr<Flux2PipelineBase> load(const std::string& folder, bool klein,
                                        const PipelineLoadOptions& options = {}) {
  if (klein)
    return std::make_unique<Flux2KleinPipeline>(Flux2KleinPipeline::from_pretrained(folder, options));
  return std::make_unique<Flux2Pipeline>(Flux2Pipeline::from_pretrained(folder, options));
}
std::unique_ptr<Flux2PipelineBase> load(const FullCase& g) {
  PipelineLoadOptions options;
  options.dtype = g.dtype;
  return load(g.folder(), g.klein(), options);
}

std::vector<int64_t> ids_of(const Tensor& t) {
  return t.to_vector<int64_t>();
}

void expect_tokens_match(const Flux2PipelineBase& pipe, const FullCase& g, const std::string& prompt,
                         const std::string& prefix) {
  ASSERT_NE(pipe.prompt_encoder(), nullptr);
  const auto [ids, mask] = pipe.prompt_encoder()->tokenize({prompt}, g.max_sequence_length);
  EXPECT_EQ(ids_of(ids), ids_of(g.file.tensor(prefix + "input_ids"))) << g.name << " " << prefix;
  EXPECT_EQ(ids_of(mask), ids_of(g.file.tensor(prefix + "attention_mask"))) << g.name << " " << prefix;
}

void expect_images_match(const PipelineOutput& out, const FullCase& g) {
  const Tensor expected = g.file.tensor("image_u8");
  ASSERT_EQ(static_cast<int64_t>(out.images.size()), expected.size(0)) << g.name;
  for (size_t b = 0; b < out.images.size(); ++b) {
    const Tensor want = expected.select(0, static_cast<int64_t>(b));
    EXPECT_EQ(out.images[b].height, want.size(0)) << g.name;
    EXPECT_EQ(out.images[b].width, want.size(1)) << g.name;
    if (g.dtype == float32) {
      EXPECT_GE(testing::share_within_one_level(out.images[b].pixels, want), 0.99)
          << g.name << " image " << b;
    } else {
      // FLUX.1's bf16 bound (tests/pipelines/flux_pipeline_test.cpp).
      EXPECT_LE(testing::mean_level_difference(out.images[b].pixels, want), 2.0) << g.name << " image " << b;
    }
  }
}

class Flux2FullPipelineGoldens : public ::testing::TestWithParam<const char*> {};

TEST_P(Flux2FullPipelineGoldens, PromptToImageMatchesDiffusers) {
  const FullCase g(GetParam());
  auto pipe = load(g);
  const int n = g.images_per_prompt;
  // In f32 the embeddings agree to float rounding (measured: at most 4e-6 of their largest value). In bf16
  // every op rounds to 8 significant bits, at points that differ from transformers', and through 30 layers
  // that adds up: Kiln's bf16 embeddings are 2.7-4.5% (of the largest value) from diffusers' bf16 ones, which
  // are themselves 2.4-6.3% from diffusers' f32 ones (the 5-layer encoders of flux2_prompt_encoder_test.cpp:
  // 2%). The bound is diffusers' own bf16 spread.
  const double tolerance = g.dtype == float32 ? 1e-4 : 6.5e-2;

  expect_tokens_match(*pipe, g, g.prompt, "");
  const Tensor embeds = pipe->encode_prompt(g.prompt, Tensor(), n, g.max_sequence_length).first;
  EXPECT_EQ(embeds.dtype(), g.dtype);
  EXPECT_TRUE(testing::rel_max_error_within(embeds, g.file.tensor("prompt_embeds"), tolerance)) << g.name;
  if (g.cfg) {
    expect_tokens_match(*pipe, g, g.negative_prompt, "negative_");
    const Tensor negative = pipe->encode_prompt(g.negative_prompt, Tensor(), n, g.max_sequence_length).first;
    EXPECT_TRUE(testing::rel_max_error_within(negative, g.file.tensor("negative_prompt_embeds"), tolerance))
        << g.name;
  }

  const PipelineOutput out = (*pipe)(g.call());
  expect_images_match(out, g);
  EXPECT_EQ(out.images[0].metadata.at("prompt"), g.prompt);
  EXPECT_EQ(out.images[0].metadata.at("max_sequence_length"), std::to_string(g.max_sequence_length));
  if (g.cfg) {
    EXPECT_EQ(out.images[0].metadata.at("negative_prompt"), g.negative_prompt);
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, Flux2FullPipelineGoldens,
                         ::testing::Values("dev_retriever_64x64_s0", "dev_unicode_80x48_s1234",
                                           "dev_empty_64x48_s7_n2", "dev_long_truncated_48x48_s5",
                                           "dev_ref1_64x48_s3", "dev_ref2_auto_s11",
                                           "devbf16_retriever_64x64_s0", "devbf16_ref1_64x48_s3",
                                           "klein_cfg_fox_64x64_s0", "klein_nocfg_unicode_48x80_s9",
                                           "klein_cfg_ref1_64x64_s2", "klein_cfg_negative_64x48_s4",
                                           "klein_cfg_empty_48x48_s6_n2", "kleinbf16_cfg_fox_64x64_s0"));

TEST(Flux2FullPipeline, TheTextEncoderIsAComponent) {
  const FullCase g("klein_cfg_ref1_64x64_s2");
  std::vector<std::string> loaded;
  PipelineLoadOptions options;
  options.on_component_loaded = [&](const std::string& name, int i, int count) {
    loaded.push_back(name);
    EXPECT_EQ(i, static_cast<int>(loaded.size()));
    EXPECT_EQ(count, 5);
  };
  auto pipe = load(g.folder(), true, options);
  EXPECT_EQ(loaded,
            (std::vector<std::string>{"scheduler", "tokenizer", "text_encoder", "transformer", "vae"}));
  const auto components = pipe->components();
  ASSERT_EQ(components.size(), 3u);
  EXPECT_EQ(components[0].first, "text_encoder");
  ASSERT_NE(components[0].second, nullptr);
  // The layers the default text_encoder_out_layers (9, 18, 27) need, of the 28: no final norm, no lm_head.
  EXPECT_EQ(pipe->prompt_encoder()->text_encoder().num_layers_built(), 27);
  EXPECT_EQ(pipe->prompt_encoder()->text_encoder_out_layers(), (std::vector<int64_t>{9, 18, 27}));

  // Model offload releases the text encoder once the prompts are encoded; no offload mode changes the image.
  const Image plain = (*pipe)(g.call()).images[0];
  std::vector<std::string> released;
  set_log_topics("offload");
  auto previous = set_log_handler([&](const std::string& line) {
    if (line.find("released") != std::string::npos) released.push_back(line.substr(0, line.find(':', 9)));
  });
  pipe->enable_model_cpu_offload();
  EXPECT_EQ((*pipe)(g.call()).images[0].pixels, plain.pixels);
  set_log_handler(previous);
  set_log_topics("");
  // The VAE after encoding the reference image, then again after decoding.
  EXPECT_EQ(released, (std::vector<std::string>{"offload: text_encoder", "offload: vae",
                                                "offload: transformer", "offload: vae"}));
  pipe->enable_group_offload({.blocks_per_group = 4, .prefetch = true});
  EXPECT_EQ((*pipe)(g.call()).images[0].pixels, plain.pixels);
  pipe->enable_sequential_cpu_offload();
  EXPECT_EQ((*pipe)(g.call()).images[0].pixels, plain.pixels);
  // A budget for the text encoder's and the transformer's weights together, not for the whole pipeline.
  const OffloadPlan plan = pipe->set_memory_budget(static_cast<int64_t>(
      components[0].second->parameter_bytes(float32) + components[1].second->parameter_bytes(float32)));
  EXPECT_EQ(plan.mode, OffloadMode::Model) << plan.describe();
  EXPECT_EQ(plan.components.front().name, "text_encoder");
  EXPECT_EQ((*pipe)(g.call()).images[0].pixels, plain.pixels);
  pipe->to(cpu);
}

TEST(Flux2FullPipeline, CompiledTextEncoderAndBlocksKeepTheImage) {
  const FullCase g("dev_unicode_80x48_s1234");
  auto pipe = load(g);
  const Image eager = (*pipe)(g.call()).images[0];
  pipe->prompt_encoder()->text_encoder().compile_repeated_blocks();
  pipe->transformer().compile_repeated_blocks();
  const PipelineOutput compiled = (*pipe)(g.call());
  expect_images_match(compiled, g);
  EXPECT_EQ(compiled.images[0].pixels.size(), eager.pixels.size());
}

std::string copy_folder(const std::string& pipeline, const std::string& name,
                        const std::function<void(const std::string& dir, nlohmann::json& index)>& edit) {
  const std::string dir = testing::temp_dir(name);
  fs::copy(testing::data_path("models/" + pipeline), dir, fs::copy_options::recursive);
  std::ifstream in(dir + "/model_index.json");
  nlohmann::json index = nlohmann::json::parse(in);
  in.close();
  edit(dir, index);
  std::ofstream(dir + "/model_index.json") << index.dump(2);
  return dir;
}

void expect_load_error(const std::string& dir, bool klein, const std::string& needle) {
  try {
    load(dir, klein);
    ADD_FAILURE() << dir << ": expected an error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Flux2FullPipeline, ListedTextComponentsLoadStrictly) {
  // A listed component whose folder is missing.
  expect_load_error(copy_folder("flux2-tiny-dev-full", "flux2_no_text_encoder",
                                [](const std::string& dir, auto&) { fs::remove_all(dir + "/text_encoder"); }),
                    false, "text_encoder");
  expect_load_error(copy_folder("flux2-tiny-klein-full", "flux2_no_tokenizer",
                                [](const std::string& dir, auto&) { fs::remove_all(dir + "/tokenizer"); }),
                    true, "tokenizer");
  // Classes Kiln does not read.
  expect_load_error(copy_folder("flux2-tiny-dev-full", "flux2_unknown_encoder",
                                [](const std::string&, auto& j) {
                                  j["text_encoder"] = {"transformers", "T5EncoderModel"};
                                }),
                    false, "'text_encoder' is a T5EncoderModel, expected Mistral3ForConditionalGeneration");
  expect_load_error(copy_folder("flux2-tiny-klein-full", "flux2_unknown_tokenizer",
                                [](const std::string&, auto& j) {
                                  j["tokenizer"] = {"transformers", "PixtralProcessor"};
                                }),
                    true, "'tokenizer' is a PixtralProcessor");
  // One of the two listed and the other null.
  expect_load_error(copy_folder("flux2-tiny-dev-full", "flux2_half_text",
                                [](const std::string&, auto& j) {
                                  j["tokenizer"] = {nullptr, nullptr};
                                }),
                    false, "'tokenizer' is missing");
  // klein's folder with FLUX.2-dev's text encoder (the class edited to match).
  expect_load_error(copy_folder("flux2-tiny-klein-full", "flux2_klein_with_mistral",
                                [](const std::string& dir, auto&) {
                                  fs::remove_all(dir + "/text_encoder");
                                  fs::copy(testing::data_path("models/flux2-tiny-dev-full/text_encoder"),
                                           dir + "/text_encoder");
                                }),
                    true, "expects a Qwen3 text encoder");
  // A transformer made for other prompt embeddings (joint_attention_dim 24, the encoder gives 3 x 32).
  expect_load_error(copy_folder("flux2-tiny-klein-full", "flux2_klein_other_transformer",
                                [](const std::string& dir, auto&) {
                                  fs::remove_all(dir + "/transformer");
                                  fs::copy(testing::data_path("models/flux2-tiny-klein/transformer"),
                                           dir + "/transformer");
                                }),
                    true, "joint_attention_dim is 24");
}

TEST(Flux2FullPipeline, NegativePromptErrors) {
  const FullCase dev("dev_retriever_64x64_s0");
  auto pipe = load(dev);
  PipelineRequest call = dev.call();
  call.negative_prompt = "blurry";
  EXPECT_THROW((*pipe)(call), Error);  // FLUX.2-dev has no negative prompt
  const FullCase k("klein_cfg_negative_64x48_s4");
  auto klein = load(k);
  call = k.call();
  call.negative_prompt_embeds = klein->encode_prompt("blurry", Tensor(), 1, k.max_sequence_length).first;
  try {
    (*klein)(call);
    ADD_FAILURE() << "negative_prompt with negative_prompt_embeds ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not both"), std::string::npos) << e.what();
  }
  // A given negative prompt is what diffusers' negative_prompt_embeds=encode_prompt(negative)[0] does.
  call.negative_prompt = "";
  call.negative_prompt_embeds =
      klein->encode_prompt(k.negative_prompt, Tensor(), 1, k.max_sequence_length).first;
  call.generator = Generator(k.seed);
  EXPECT_EQ((*klein)(call).images[0].pixels, (*klein)(k.call()).images[0].pixels);
}

}  // namespace
}  // namespace kiln
