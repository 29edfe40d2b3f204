// FLUX.2's text encoders (the Mistral 3 language model, Qwen3) against transformers, on the tiny models made
// by tools/goldens/flux2_text.py: every hidden state of every layer, in float32 and bfloat16, both Mistral
// key layouts.
#include <gtest/gtest.h>

#include "kiln/core/error.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/decoder_text_encoder.h"
#include "support/test_data.h"

namespace kiln {
namespace {

std::string model(const std::string& family) {
  return testing::data_path("models/flux2-tiny-text/" + family + "/text_encoder");
}
io::SafetensorsFile golden(const std::string& family) {
  return io::SafetensorsFile(testing::data_path("goldens/flux2_text/" + family + ".safetensors"));
}

constexpr int kCases = 3;
constexpr int kLayers = 5;

class DecoderTextEncoderGoldens : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderTextEncoderGoldens, EveryHiddenStateMatchesTransformersFloat32) {
  const std::string family = GetParam();
  const std::string folder = family == "dev-model-prefix" ? model("dev-model-prefix") : model(family);
  auto refs = golden(family == "dev-model-prefix" ? "dev" : family);
  auto encoder = models::load_decoder_text_encoder(folder, float32, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(encoder->num_layers_built(), kLayers);
  for (int c = 0; c < kCases; ++c) {
    const std::string p = "case" + std::to_string(c) + "_";
    const auto states = encoder->hidden_states(refs.tensor(p + "input_ids"),
                                               refs.tensor(p + "attention_mask"), {0, 1, 2, 3, 4, 5});
    for (int k = 0; k <= kLayers; ++k) {
      EXPECT_TRUE(testing::rel_max_error_within(states[static_cast<size_t>(k)],
                                                refs.tensor(p + "hidden_" + std::to_string(k)), 1e-4))
          << family << " case " << c << " hidden state " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Flux2, DecoderTextEncoderGoldens,
                         ::testing::Values("dev", "dev-model-prefix", "klein"));

TEST(DecoderTextEncoder, BuildsAndLoadsOnlyTheLayersAsked) {
  auto refs = golden("dev");
  auto encoder = models::load_decoder_text_encoder(model("dev"), float32, {1, 3});
  EXPECT_EQ(encoder->num_layers_built(), 3);
  EXPECT_LT(encoder->num_parameters(),
            models::load_decoder_text_encoder(model("dev"), float32, {5})->num_parameters());
  const auto states =
      encoder->hidden_states(refs.tensor("case0_input_ids"), refs.tensor("case0_attention_mask"), {3, 1});
  EXPECT_TRUE(testing::rel_max_error_within(states[0], refs.tensor("case0_hidden_3"), 1e-4));
  EXPECT_TRUE(testing::rel_max_error_within(states[1], refs.tensor("case0_hidden_1"), 1e-4));
  EXPECT_THROW(
      encoder->hidden_states(refs.tensor("case0_input_ids"), refs.tensor("case0_attention_mask"), {4}),
      Error);
}

TEST(DecoderTextEncoder, ConfigsReadAsTransformersDoes) {
  const auto mistral = models::DecoderTextEncoderConfig::from_file(model("dev") + "/config.json");
  EXPECT_EQ(mistral.family, models::DecoderFamily::Mistral);
  EXPECT_EQ(mistral.head_dim, 16);  // from the config, not hidden_size / heads (12)
  EXPECT_EQ(mistral.num_key_value_heads, 2);
  EXPECT_DOUBLE_EQ(mistral.rope_theta, 1e9);
  const auto qwen = models::DecoderTextEncoderConfig::from_file(model("klein") + "/config.json");
  EXPECT_EQ(qwen.family, models::DecoderFamily::Qwen3);
  EXPECT_DOUBLE_EQ(qwen.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(qwen.rope_theta, 1e6);
}

TEST(DecoderTextEncoder, BadInputsAreClearErrors) {
  auto refs = golden("klein");
  auto encoder = models::load_decoder_text_encoder(model("klein"), float32, {2});
  const Tensor ids = refs.tensor("case0_input_ids");
  EXPECT_THROW(encoder->hidden_states(ids, refs.tensor("case1_attention_mask"), {2}), Error);  // shape
  EXPECT_THROW(encoder->hidden_states(Tensor::from_vector<int64_t>({1, 100000}, {1, 2}),
                                      Tensor::from_vector<int64_t>({1, 1}, {1, 2}), {2}),
               Error);  // id outside the vocabulary
  EXPECT_THROW(encoder->hidden_states(ids, refs.tensor("case0_attention_mask"), {9}), Error);
  EXPECT_THROW(models::load_decoder_text_encoder(model("klein"), float32, {6}), Error);
  EXPECT_THROW(
      models::load_decoder_text_encoder(testing::data_path("models/flux2-tiny-text/dev"), float32, {1}),
      Error);  // no config.json there
}

}  // namespace
}  // namespace kiln
