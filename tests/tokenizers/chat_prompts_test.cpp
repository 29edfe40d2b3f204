// The rendered chat prompts equal what transformers' apply_chat_template gives on diffusers' messages with
// the committed templates (tests/data/models/flux2-tiny-text/*/tokenizer, written by
// tools/goldens/flux2_tokenizers.py).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/tokenizers/chat_prompts.h"
#include "support/test_data.h"

namespace kiln::tokenizers {
namespace {

const nlohmann::json& refs() {
  static const nlohmann::json j = [] {
    std::ifstream f(testing::data_path("goldens/flux2_text/tokenizer_ids.json"));
    return nlohmann::json::parse(f);
  }();
  return j;
}

TEST(ChatPrompts, MistralPromptEqualsTheProcessorsRendering) {
  size_t n = 0;
  for (const auto& c : refs()["mistral"]["prompts"]) {
    EXPECT_EQ(mistral_flux2_chat_prompt(c["prompt"].get<std::string>(), "<s>"),
              c["rendered"].get<std::string>());
    ++n;
  }
  EXPECT_GT(n, 10u);
}

TEST(ChatPrompts, Qwen3PromptEqualsTheTokenizersRendering) {
  size_t n = 0;
  for (const auto& c : refs()["qwen3"]["prompts"]) {
    EXPECT_EQ(qwen3_chat_prompt(c["prompt"].get<std::string>()), c["rendered"].get<std::string>());
    ++n;
  }
  EXPECT_GT(n, 10u);
}

TEST(ChatPrompts, ImageTokensAreRemovedInOnePass) {
  EXPECT_EQ(remove_image_tokens("a [IMG] b[IMG][IMG]c"), "a  bc");
  EXPECT_EQ(remove_image_tokens("[IM[IMG]G]"), "[IMG]");  // Python's str.replace does not rescan
  EXPECT_EQ(remove_image_tokens(""), "");
}

}  // namespace
}  // namespace kiln::tokenizers
