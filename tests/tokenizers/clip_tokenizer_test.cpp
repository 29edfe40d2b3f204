#include "kiln/tokenizers/clip_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "kiln/core/error.h"
#include "tokenizers/tokenizer_refs.h"

namespace kiln::tokenizers {
namespace {

namespace fs = std::filesystem;
using kiln::testing::tokenizer_case;
using kiln::testing::tokenizer_fixture;
using kiln::testing::tokenizer_refs;

ClipTokenizer clip_g() {
  const fs::path clip = tokenizer_fixture("clip"), g = tokenizer_fixture("clip_g");
  return ClipTokenizer::from_files(
      {clip / "vocab.json", clip / "merges.txt", g / "tokenizer_config.json", g / "special_tokens_map.json"});
}

void expect_matches_refs(const ClipTokenizer& tok, const std::string& case_name) {
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

TEST(ClipTokenizerTest, MatchesTransformersClipL) {
  const ClipTokenizer tok = ClipTokenizer::from_directory(tokenizer_fixture("clip"));
  EXPECT_EQ(tok.vocab_size(), 49408u);
  EXPECT_EQ(tok.bos_id(), 49406);
  EXPECT_EQ(tok.eos_id(), 49407);
  EXPECT_EQ(tok.pad_id(), 49407);
  EXPECT_EQ(tok.model_max_length(), 77);
  expect_matches_refs(tok, "clip_l");
}

TEST(ClipTokenizerTest, MatchesTransformersClipGWithBangPadding) {
  const ClipTokenizer tok = clip_g();
  EXPECT_EQ(tok.pad_id(), 0);
  expect_matches_refs(tok, "clip_g");
}

TEST(ClipTokenizerTest, DefaultsToModelMaxLengthAndKeepsEos) {
  const ClipTokenizer tok = ClipTokenizer::from_directory(tokenizer_fixture("clip"));
  std::string long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt += "cat ";
  const Encoding e = tok.encode(long_prompt);
  ASSERT_EQ(e.ids.size(), 77u);
  EXPECT_EQ(e.ids.front(), 49406);
  EXPECT_EQ(e.ids.back(), 49407);
  EXPECT_EQ(e.ids[1], tok.token_to_id("cat</w>"));
  const Encoding unpadded = tok.encode("a cat", {.max_length = 77, .pad_to_max_length = false});
  EXPECT_EQ(unpadded.ids, (std::vector<int64_t>{49406, 320, 2368, 49407}));
  EXPECT_EQ(unpadded.attention_mask, (std::vector<int64_t>{1, 1, 1, 1}));
  const Encoding untruncated =
      tok.encode(long_prompt, {.max_length = 77, .truncation = false, .pad_to_max_length = false});
  EXPECT_EQ(untruncated.ids.size(), 102u);
}

TEST(ClipTokenizerTest, RejectsBadArguments) {
  const ClipTokenizer tok = ClipTokenizer::from_directory(tokenizer_fixture("clip"));
  EXPECT_THROW(tok.encode("a cat", {.max_length = 1}), Error);
  try {
    tok.encode("bad \xff utf8");
    FAIL() << "invalid UTF-8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("UTF-8"), std::string::npos) << e.what();
  }
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

void expect_error_mentions(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    FAIL() << "expected kiln::Error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ClipTokenizerTest, ReportsMissingAndCorruptFiles) {
  const fs::path dir = kiln::testing::temp_dir("clip_tokenizer_errors");
  expect_error_mentions([&] { ClipTokenizer::from_directory(dir / "nope"); }, "does not exist");
  // No vocab.json.
  expect_error_mentions([&] { ClipTokenizer::from_directory(dir); }, "vocab.json");

  const fs::path clip = tokenizer_fixture("clip");
  write(dir / "vocab.json", "{\"a\": 0, \"b\": ");
  expect_error_mentions(
      [&] {
        ClipTokenizer::from_files({dir / "vocab.json", clip / "merges.txt"});
      },
      "invalid JSON");
  write(dir / "vocab.json", "{\"a\": 0, \"b\": 1, \"ab\": 2, \"<|startoftext|>\": 3, \"<|endoftext|>\": 4}");
  write(dir / "merges.txt", "#version: 0.2\na b\nb\n");
  expect_error_mentions(
      [&] {
        ClipTokenizer::from_files({dir / "vocab.json", dir / "merges.txt"});
      },
      "line 3");
  write(dir / "merges.txt", "#version: 0.2\na c\n");
  expect_error_mentions(
      [&] {
        ClipTokenizer::from_files({dir / "vocab.json", dir / "merges.txt"});
      },
      "missing from the vocabulary");
  write(dir / "merges.txt", "#version: 0.2\na b\n");
  write(dir / "special_tokens_map.json", "{\"pad_token\": \"<pad>\"}");
  expect_error_mentions(
      [&] {
        ClipTokenizer::from_files(
            {dir / "vocab.json", dir / "merges.txt", {}, dir / "special_tokens_map.json"});
      },
      "pad_token");
  // A tiny valid vocabulary works: "ab" merges, "b" alone is a word ending.
  write(dir / "vocab.json",
        "{\"a\": 0, \"b\": 1, \"a</w>\": 2, \"b</w>\": 3, \"ab</w>\": 4, \"<|startoftext|>\": 5, "
        "\"<|endoftext|>\": 6}");
  write(dir / "merges.txt", "#version: 0.2\na b</w>\n");
  const ClipTokenizer tiny = ClipTokenizer::from_files({dir / "vocab.json", dir / "merges.txt"});
  EXPECT_EQ(tiny.tokenize("AB b"), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(tiny.encode("ab", {.max_length = 4}).ids, (std::vector<int64_t>{5, 4, 6, 6}));
}

}  // namespace
}  // namespace kiln::tokenizers
