// The tokenizer.json BPE tokenizers of FLUX.2 (Mistral's Tekken vocabulary as FLUX.2-dev ships it and with
// Tekken's own pattern, Qwen3 for klein) against transformers' ids, written by
// tools/goldens/flux2_tokenizers.py.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/core/error.h"
#include "kiln/tokenizers/bpe_tokenizer.h"
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

std::string folder(const std::string& name) {
  if (name == "mistral") return testing::data_path("models/flux2-tiny-text/dev/tokenizer");
  if (name == "qwen3") return testing::data_path("models/flux2-tiny-text/klein/tokenizer");
  return testing::data_path("tokenizers/tekken");
}

std::vector<int64_t> ids_of(const nlohmann::json& j) {
  return j.get<std::vector<int64_t>>();
}

class BpeTokenizerRefs : public ::testing::TestWithParam<std::string> {};

TEST_P(BpeTokenizerRefs, PlainTextIdsEqualTransformers) {
  const auto tok = BpeTokenizer::from_directory(folder(GetParam()));
  for (const auto& c : refs()[GetParam()]["plain"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok.tokenize(text), ids_of(c["ids"])) << GetParam() << ": " << text;
    BpeEncodeOptions options;
    options.truncation = false;
    options.pad_to_max_length = false;
    EXPECT_EQ(tok.encode(text, options).ids, ids_of(c["ids_with_specials"])) << GetParam() << ": " << text;
  }
}

// The rendered chat prompts, tokenized as diffusers' encode_prompt does: padding="max_length", truncation,
// and no post-processor specials when the rendered text already starts with BOS
// (ProcessorMixin.apply_chat_template).
TEST_P(BpeTokenizerRefs, PaddedTruncatedPromptIdsEqualTransformers) {
  const auto tok = BpeTokenizer::from_directory(folder(GetParam()));
  EXPECT_EQ(refs()[GetParam()]["padding_side"], tok.padding_side() == PaddingSide::Left ? "left" : "right");
  size_t truncated = 0;
  for (const auto& c : refs()[GetParam()]["prompts"]) {
    const std::string rendered = c["rendered"];
    BpeEncodeOptions options;
    options.max_length = c["max_length"];
    options.add_special_tokens = tok.bos_token().empty() || rendered.rfind(tok.bos_token(), 0) != 0;
    const Encoding e = tok.encode(rendered, options);
    EXPECT_EQ(e.ids, ids_of(c["input_ids"])) << GetParam() << ": " << rendered;
    EXPECT_EQ(e.attention_mask, ids_of(c["attention_mask"])) << GetParam() << ": " << rendered;
    if (tok.tokenize(rendered).size() > static_cast<size_t>(options.max_length)) ++truncated;
  }
  EXPECT_GT(truncated, 0u) << "the prompt set must exercise truncation";
}

INSTANTIATE_TEST_SUITE_P(Flux2, BpeTokenizerRefs, ::testing::Values("mistral", "tekken", "qwen3"));

// Options the FLUX.2 files leave off: byte fallback, unk and fuse_unk; the Split behaviours other than
// Isolated, invert, ByteLevel's own GPT-2 split with a prefix space, NFD + Lowercase; against the tokenizers
// library's ids.
TEST(BpeTokenizer, OtherModelOptionsAndSplitBehaviorsMatchTokenizers) {
  for (const char* name : {"byte_fallback", "behaviors"}) {
    const auto tok = BpeTokenizer::from_files(
        testing::data_path(std::string("tokenizers/bpe_variants/") + name + "/tokenizer.json"));
    size_t n = 0;
    for (const auto& c : refs()["variants"][name]) {
      EXPECT_EQ(tok.tokenize(c["text"].get<std::string>()), ids_of(c["ids"])) << name << ": " << c["text"];
      ++n;
    }
    EXPECT_GT(n, 5u);
  }
}

TEST(BpeTokenizer, SpecialTokensAndConfigAsTransformersReadsThem) {
  const auto mistral = BpeTokenizer::from_directory(folder("mistral"));
  EXPECT_EQ(mistral.bos_token(), "<s>");
  EXPECT_EQ(mistral.bos_id(), 1);
  EXPECT_EQ(mistral.pad_id(), 11);
  EXPECT_EQ(mistral.token_to_id("[SYSTEM_PROMPT]"), 17);
  const auto qwen = BpeTokenizer::from_directory(folder("qwen3"));
  EXPECT_EQ(qwen.bos_token(), "");
  EXPECT_FALSE(qwen.bos_id().has_value());
  EXPECT_EQ(qwen.pad_id(), qwen.token_to_id("<|endoftext|>"));
  EXPECT_EQ(qwen.eos_id(), qwen.token_to_id("<|im_end|>"));
  EXPECT_EQ(qwen.model_max_length(), 131072);
  // len(tokenizer) in transformers, which tools/goldens/flux2_text.py gave the tiny models as vocab_size.
  EXPECT_EQ(qwen.vocab_size(), 924u);
  EXPECT_EQ(mistral.vocab_size(), 932u);
}

TEST(BpeTokenizer, LeftPaddingFromTheConfig) {
  const std::string dir = testing::temp_dir("bpe_left_padding");
  for (const char* f : {"tokenizer.json", "special_tokens_map.json"})
    std::filesystem::copy_file(folder("mistral") + "/" + f, dir + "/" + f,
                               std::filesystem::copy_options::overwrite_existing);
  nlohmann::json config;
  std::ifstream(folder("mistral") + "/tokenizer_config.json") >> config;
  config["padding_side"] = "left";
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  const auto tok = BpeTokenizer::from_directory(dir);
  BpeEncodeOptions options;
  options.max_length = 8;
  const Encoding e = tok.encode("a cat", options);
  const std::vector<int64_t> text = tok.tokenize("a cat");
  ASSERT_LT(text.size() + 1, 8u);
  EXPECT_EQ(e.ids.back(), text.back());
  EXPECT_EQ(e.ids.front(), 11);
  EXPECT_EQ(e.attention_mask.front(), 0);
  EXPECT_EQ(e.attention_mask.back(), 1);
  EXPECT_EQ(e.ids[8 - text.size() - 1], 1) << "BOS right before the text";
}

TEST(BpeTokenizer, BadFilesAreClearErrors) {
  const std::string dir = testing::temp_dir("bpe_bad_files");
  EXPECT_THROW(BpeTokenizer::from_directory(dir + "/missing"), Error);
  nlohmann::json j;
  std::ifstream(folder("qwen3") + "/tokenizer.json") >> j;
  auto write_and_expect = [&](const nlohmann::json& file, const std::string& needle) {
    std::ofstream(dir + "/tokenizer.json") << file.dump();
    try {
      BpeTokenizer::from_files(dir + "/tokenizer.json");
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto unigram = j;
  unigram["model"]["type"] = "Unigram";
  write_and_expect(unigram, "expected \"BPE\"");
  auto metaspace = j;
  metaspace["pre_tokenizer"] = {{"type", "Metaspace"}};
  write_and_expect(metaspace, "unsupported pre_tokenizer \"Metaspace\"");
  auto lookbehind = j;
  lookbehind["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(?<=a)b";
  write_and_expect(lookbehind, "lookbehind");
  auto bad_merge = j;
  bad_merge["model"]["merges"][0] = "nospace";
  write_and_expect(bad_merge, "BPE merge 1");
  auto missing_token = j;
  missing_token["model"]["merges"][0] = {"\xE2\x82\xAC\xE2\x82\xAC", "zz"};
  write_and_expect(missing_token, "missing from the vocabulary");
  std::ofstream(dir + "/tokenizer.json") << "{ not json";
  EXPECT_THROW(BpeTokenizer::from_files(dir + "/tokenizer.json"), Error);
}

TEST(BpeTokenizer, InvalidUtf8InputIsAnError) {
  const auto tok = BpeTokenizer::from_directory(folder("qwen3"));
  EXPECT_THROW(tok.tokenize("abc\xC3"), Error);
  EXPECT_THROW(tok.tokenize("\xED\xA0\x80"), Error);  // a surrogate
}

}  // namespace
}  // namespace kiln::tokenizers
