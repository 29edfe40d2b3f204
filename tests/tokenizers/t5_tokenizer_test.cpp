#include "kiln/tokenizers/t5_tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "kiln/core/error.h"
#include "tokenizers/sentencepiece_model.h"
#include "tokenizers/tokenizer_refs.h"

namespace kiln::tokenizers {
namespace {

namespace fs = std::filesystem;
using kiln::testing::tokenizer_case;
using kiln::testing::tokenizer_fixture;
using kiln::testing::tokenizer_refs;

void expect_matches_refs(const T5Tokenizer& tok, const std::string& case_name) {
  const auto& c = tokenizer_case(case_name);
  const auto& prompts = tokenizer_refs()["prompts"];
  const int64_t max_length = c["max_length"];
  ASSERT_EQ(prompts.size(), c["results"].size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string prompt = prompts[i];
    const auto& r = c["results"][i];
    SCOPED_TRACE(case_name + " prompt " + std::to_string(i) + ": \"" + prompt.substr(0, 80) + "\"");
    EXPECT_EQ(tok.tokenize(prompt), r["tokens"].get<std::vector<int64_t>>());
    const Encoding e = tok.encode(prompt, {.max_length = max_length});
    EXPECT_EQ(e.ids, r["ids"].get<std::vector<int64_t>>());
    EXPECT_EQ(e.attention_mask, r["mask"].get<std::vector<int64_t>>());
  }
}

TEST(T5TokenizerTest, TokenizerJsonMatchesTransformers) {
  const T5Tokenizer tok = T5Tokenizer::from_directory(tokenizer_fixture("t5"));
  EXPECT_EQ(tok.vocab_size(), 2100u);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.unk_id(), 2);
  EXPECT_EQ(tok.model_max_length(), 512);
  EXPECT_EQ(tok.token_to_id("<extra_id_0>"), 2099);
  expect_matches_refs(tok, "t5_256");
  expect_matches_refs(tok, "t5_512");
}

TEST(T5TokenizerTest, SpieceModelMatchesTransformers) {
  const fs::path dir = tokenizer_fixture("t5");
  const T5Tokenizer tok =
      T5Tokenizer::from_sentencepiece(dir / "spiece.model", 100, dir / "tokenizer_config.json");
  EXPECT_EQ(tok.vocab_size(), 2100u);
  EXPECT_EQ(tok.token_to_id("<extra_id_99>"), 2000);
  expect_matches_refs(tok, "t5_256");
  expect_matches_refs(tok, "t5_512");
  // Without any config file: T5 defaults.
  const T5Tokenizer bare = T5Tokenizer::from_sentencepiece(dir / "spiece.model");
  EXPECT_EQ(bare.encode("a cat", {.max_length = 8}).ids, tok.encode("a cat", {.max_length = 8}).ids);
}

TEST(T5TokenizerTest, VariantTokenizerJsonMatchesTokenizersLibrary) {
  // Metaspace with prepend_scheme "first", Strip/Replace/Lowercase/NFC normalisers.
  const T5Tokenizer tok =
      T5Tokenizer::from_tokenizer_json(tokenizer_fixture("t5_variant") + "/tokenizer.json");
  expect_matches_refs(tok, "t5_variant");
}

TEST(T5TokenizerTest, ReadsSentencePieceModelFields) {
  const SentencePieceModel m = SentencePieceModel::load(tokenizer_fixture("t5") + "/spiece.model");
  ASSERT_EQ(m.pieces.size(), 2000u);
  EXPECT_EQ(m.pieces[0].piece, "<pad>");
  EXPECT_EQ(m.pieces[0].type, SentencePieceModel::PieceType::Control);
  EXPECT_EQ(m.pieces[1].piece, "</s>");
  EXPECT_EQ(m.pieces[2].piece, "<unk>");
  EXPECT_EQ(m.pieces[2].type, SentencePieceModel::PieceType::Unknown);
  EXPECT_EQ(m.pieces[3].type, SentencePieceModel::PieceType::Normal);
  EXPECT_LT(m.pieces[3].score, 0.0f);
  EXPECT_EQ(m.model_type, 1);
  EXPECT_EQ(m.unk_id, 2);
  EXPECT_EQ(m.eos_id, 1);
  EXPECT_EQ(m.pad_id, 0);
  EXPECT_EQ(m.bos_id, -1);
  EXPECT_FALSE(m.byte_fallback);
  EXPECT_EQ(m.normalizer_name, "nmt_nfkc");
  EXPECT_TRUE(m.add_dummy_prefix);
  EXPECT_TRUE(m.remove_extra_whitespaces);
  EXPECT_GT(m.precompiled_charsmap.size(), 1000u);
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void expect_error_mentions(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    FAIL() << "expected kiln::Error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(T5TokenizerTest, ReportsMissingAndCorruptFiles) {
  const fs::path dir = kiln::testing::temp_dir("t5_tokenizer_errors");
  expect_error_mentions([&] { T5Tokenizer::from_directory(dir / "nope"); }, "does not exist");
  expect_error_mentions([&] { T5Tokenizer::from_directory(dir); }, "neither tokenizer.json nor spiece.model");

  const std::string model = read(tokenizer_fixture("t5") + "/spiece.model");
  write(dir / "truncated.model", model.substr(0, model.size() / 2));
  expect_error_mentions([&] { T5Tokenizer::from_sentencepiece(dir / "truncated.model"); }, "truncated.model");
  write(dir / "garbage.model", std::string(64, '\xff'));
  expect_error_mentions([&] { T5Tokenizer::from_sentencepiece(dir / "garbage.model"); }, "garbage.model");
  write(dir / "empty.model", "");
  expect_error_mentions([&] { T5Tokenizer::from_sentencepiece(dir / "empty.model"); }, "no pieces");

  const std::string json = read(tokenizer_fixture("t5") + "/tokenizer.json");
  write(dir / "cut.json", json.substr(0, 1000));
  expect_error_mentions([&] { T5Tokenizer::from_tokenizer_json(dir / "cut.json"); }, "invalid JSON");
  write(dir / "bpe.json", R"({"model": {"type": "BPE", "vocab": {}, "merges": []}})");
  expect_error_mentions([&] { T5Tokenizer::from_tokenizer_json(dir / "bpe.json"); }, "expected \"Unigram\"");
  write(
      dir / "nfkc.json",
      R"({"normalizer": {"type": "NFKC"}, "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0]]}})");
  expect_error_mentions([&] { T5Tokenizer::from_tokenizer_json(dir / "nfkc.json"); },
                        "unsupported normalizer");
  write(dir / "regex.json",
        R"({"normalizer": {"type": "Replace", "pattern": {"Regex": "a|b"}, "content": ""},)"
        R"( "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0]]}})");
  expect_error_mentions([&] { T5Tokenizer::from_tokenizer_json(dir / "regex.json"); },
                        "unsupported Replace regex");
  write(dir / "charsmap.json", R"({"normalizer": {"type": "Precompiled", "precompiled_charsmap": "AAAA"},)"
                               R"( "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0]]}})");
  expect_error_mentions([&] { T5Tokenizer::from_tokenizer_json(dir / "charsmap.json"); },
                        "precompiled_charsmap");
  write(dir / "unk.json", R"({"model": {"type": "Unigram", "unk_id": 5, "vocab": [["<unk>", 0.0]]}})");
  expect_error_mentions([&] { T5Tokenizer::from_tokenizer_json(dir / "unk.json"); }, "unk_id 5");
}

TEST(T5TokenizerTest, UnknownCharactersFuseIntoOneUnk) {
  const T5Tokenizer tok = T5Tokenizer::from_directory(tokenizer_fixture("t5"));
  // CJK is not in the fixture vocabulary: a run of unknown characters is one <unk>.
  const std::vector<int64_t> ids = tok.tokenize("東京タワー");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), int64_t{2}), 1);
  // max_length 0 means model_max_length (512 here).
  const Encoding e = tok.encode("x");
  ASSERT_EQ(e.ids.size(), 512u);
  EXPECT_EQ(e.ids[e.ids.size() - 1], 0);
  EXPECT_THROW(tok.encode("x", {.max_length = -1, .truncation = true, .pad_to_max_length = true}).ids.at(600),
               std::out_of_range);
}

}  // namespace
}  // namespace kiln::tokenizers
