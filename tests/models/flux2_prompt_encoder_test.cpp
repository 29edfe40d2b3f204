// Flux2PromptEncoder against diffusers' Flux2Pipeline / Flux2KleinPipeline prompt encoding on the tiny
// pipelines of tools/goldens/flux2_text.py: ids, prompt_embeds (f32 within 1e-4, bf16 within rounding) and
// text_ids, in every execution mode.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/flux2_prompt_encoder.h"
#include "kiln/ops.h"
#include "kiln/runtime/eager_mode.h"
#include "kiln/runtime/execution_context.h"
#include "support/test_data.h"

namespace kiln {
namespace {

const nlohmann::json& cases() {
  static const nlohmann::json j = [] {
    std::ifstream f(testing::data_path("goldens/flux2_text/cases.json"));
    return nlohmann::json::parse(f);
  }();
  return j;
}
std::vector<std::string> prompts() {
  return cases()["prompts"].get<std::vector<std::string>>();
}
std::string pipeline(const std::string& family) {
  return testing::data_path("models/flux2-tiny-text/" + family);
}
io::SafetensorsFile golden(const std::string& family) {
  return io::SafetensorsFile(testing::data_path("goldens/flux2_text/" + family + ".safetensors"));
}
Flux2PromptEncoder load(const std::string& family, const nlohmann::json& c, DType dtype = float32) {
  Flux2PromptEncoderOptions options;
  options.dtype = dtype;
  options.text_encoder_out_layers = c["layers"].get<std::vector<int64_t>>();
  return Flux2PromptEncoder::from_pretrained(pipeline(family), options);
}

class Flux2PromptEncoderGoldens : public ::testing::TestWithParam<std::string> {};

TEST_P(Flux2PromptEncoderGoldens, IdsEmbeddingsAndTextIdsMatchDiffusersFloat32) {
  const std::string family = GetParam();
  auto refs = golden(family);
  const auto& list = cases()[family]["cases"];
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string p = "case" + std::to_string(i) + "_";
    const auto encoder = load(family, list[i]);
    const int64_t max_len = list[i]["max_sequence_length"];
    const auto [ids, mask] = encoder.tokenize(prompts(), max_len);
    EXPECT_EQ(ids.to_vector<int64_t>(), refs.tensor(p + "input_ids").to_vector<int64_t>())
        << family << " " << i;
    EXPECT_EQ(mask.to_vector<int64_t>(), refs.tensor(p + "attention_mask").to_vector<int64_t>())
        << family << " " << i;
    const auto out = encoder.encode(prompts(), max_len);
    EXPECT_EQ(out.prompt_embeds.shape(), refs.tensor(p + "prompt_embeds").shape());
    EXPECT_EQ(out.prompt_embeds.size(2), encoder.embedding_dim());
    EXPECT_TRUE(testing::rel_max_error_within(out.prompt_embeds, refs.tensor(p + "prompt_embeds"), 1e-4))
        << family << " case " << i;
    EXPECT_EQ(out.text_ids.to_vector<int64_t>(), refs.tensor(p + "text_ids").to_vector<int64_t>());
  }
}

// As TextEncoders.Bfloat16StaysWithinRoundingOfTransformers bounds T5: bf16 rounds every op to 8 significant
// bits, and transformers rounds a few intermediates (RoPE tables, q.k^T) that Kiln keeps in float32.
TEST_P(Flux2PromptEncoderGoldens, Bfloat16StaysWithinRoundingOfDiffusers) {
  const std::string family = GetParam();
  auto refs = golden(family);
  const auto& c = cases()[family]["bf16_cases"][0];
  const auto encoder = load(family, c, bfloat16);
  const auto out = encoder.encode(prompts(), c["max_sequence_length"]);
  EXPECT_EQ(out.prompt_embeds.dtype(), bfloat16);
  EXPECT_TRUE(
      testing::rel_max_error_within(out.prompt_embeds, refs.tensor("bf16_case0_prompt_embeds"), 3e-2));
}

enum class Mode { Fuse, Compile, CompileBlocks };

TEST_P(Flux2PromptEncoderGoldens, EveryExecutionModeGivesTheEagerResult) {
  const std::string family = GetParam();
  auto refs = golden(family);
  const auto& c = cases()[family]["cases"][1];
  const int64_t max_len = c["max_sequence_length"];
  const Tensor eager = load(family, c).encode(prompts(), max_len).prompt_embeds;
  for (Mode mode : {Mode::Fuse, Mode::Compile, Mode::CompileBlocks}) {
    auto encoder = load(family, c);
    Tensor out;
    if (mode == Mode::Fuse) {
      EagerModeGuard fuse(EagerMode::DeferAndFuse);
      out = encoder.encode(prompts(), max_len).prompt_embeds;
    } else {
      if (mode == Mode::Compile) encoder.text_encoder().compile({.fullgraph = true, .dynamic = false});
      if (mode == Mode::CompileBlocks) encoder.text_encoder().compile_repeated_blocks();
      out = encoder.encode(prompts(), max_len).prompt_embeds;
      // A second call with the same shapes reuses the program.
      EXPECT_TRUE(testing::rel_max_error_within(encoder.encode(prompts(), max_len).prompt_embeds, out, 0.0));
      EXPECT_EQ(encoder.text_encoder().compiled_program_count(), mode == Mode::Compile ? 1u : 0u);
    }
    synchronize();
    EXPECT_TRUE(testing::rel_max_error_within(out, eager, 1e-5)) << family << " mode " << int(mode);
    EXPECT_TRUE(testing::rel_max_error_within(out, refs.tensor("case1_prompt_embeds"), 1e-4))
        << family << " mode " << int(mode);
  }
}

INSTANTIATE_TEST_SUITE_P(Flux2, Flux2PromptEncoderGoldens, ::testing::Values("dev", "klein"));

TEST(Flux2PromptEncoder, NumImagesPerPromptRepeatsEachPromptsRows) {
  const auto& c = cases()["klein"]["cases"][2];
  const auto encoder = load("klein", c);
  const auto one = encoder.encode({"a cat", "a dog"}, 16);
  const auto three = encoder.encode({"a cat", "a dog"}, 16, 3);
  ASSERT_EQ(three.prompt_embeds.size(0), 6);
  EXPECT_EQ(three.text_ids.size(0), 6);
  for (int64_t r = 0; r < 6; ++r) {
    EXPECT_TRUE(testing::rel_max_error_within(three.prompt_embeds.select(0, r),
                                              one.prompt_embeds.select(0, r / 3), 0.0));
  }
}

TEST(Flux2PromptEncoder, DefaultsAndBadInputs) {
  EXPECT_EQ(Flux2PromptEncoder::default_layers(models::DecoderFamily::Mistral),
            (std::vector<int64_t>{10, 20, 30}));
  EXPECT_EQ(Flux2PromptEncoder::default_layers(models::DecoderFamily::Qwen3),
            (std::vector<int64_t>{9, 18, 27}));
  // The tiny encoders have 5 layers: the pipelines' default layers do not exist there.
  EXPECT_THROW(Flux2PromptEncoder::from_pretrained(pipeline("klein")), Error);
  EXPECT_THROW(Flux2PromptEncoder::from_pretrained(testing::data_path("models/flux-tiny-dev")), Error);
  const auto encoder = load("dev", cases()["dev"]["cases"][0]);
  EXPECT_EQ(encoder.family(), models::DecoderFamily::Mistral);
  EXPECT_THROW(encoder.encode({}, 16), Error);
  EXPECT_THROW(encoder.encode({"x"}, 0), Error);
  EXPECT_THROW(encoder.encode({"x"}, 16, 0), Error);
  EXPECT_EQ(encoder.chat_prompt("a [IMG]cat").find("[IMG]"), std::string::npos);
}

}  // namespace
}  // namespace kiln
