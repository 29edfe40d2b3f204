// Tokenizer files under fuzz/crashes/ that once crashed a loader, with the error they must give now
// (docs/reliability.md).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iterator>

#include "io/io_test_util.h"
#include "kiln/tokenizers/t5_tokenizer.h"
#include "support/test_data.h"
#include "tokenizers/regex.h"
#include "tokenizers/unicode.h"

namespace kiln::tokenizers {
namespace {

std::string reproducer(const std::string& target, const std::string& name) {
  return kiln::testing::data_path("../../fuzz/crashes/" + target + "/" + name);
}

TEST(TokenizerFuzzRegressions, TokenizerJsonNestedTooDeep) {
  const std::string path = reproducer("tokenizer_json", "json-nested-100000-deep-in-vocab");
  EXPECT_KILN_ERROR(T5Tokenizer::from_tokenizer_json(path), path, "JSON nested deeper than 64 levels");
}

// Every prefix of every piece was kept as a string: one 80000-byte piece took 3.2 GB (past the fuzzers'
// 2 GB limit; found by review, as the corpus's inputs are smaller). The pieces are a trie now, and a piece
// longer than 1024 bytes is refused (each would make segmenting a prompt cost its length times the piece's).
TEST(TokenizerFuzzRegressions, HugeUnigramPieceIsRefused) {
  const double before = kiln::testing::process_status_bytes("VmHWM");
  const std::string path = reproducer("tokenizer_json", "unigram-piece-of-80000-bytes");
  EXPECT_KILN_ERROR(T5Tokenizer::from_tokenizer_json(path), path,
                    "Unigram piece 3 is 80000 bytes, longer than the 1024 a piece may have");
  EXPECT_LT(kiln::testing::process_status_bytes("VmHWM") - before, 100e6);
}

// A regex reproducer (pattern NUL text, as the regex target reads it) compiled and searched over its text
// like a Split pre-tokenizer, match after match under one budget; the error it gives, "" when none.
std::string regex_outcome(const std::string& name) {
  std::ifstream in(reproducer("regex", name), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t nul = bytes.find('\0');
  EXPECT_NE(nul, std::string::npos) << name;
  try {
    const Regex re = Regex::compile(bytes.substr(0, nul), "tokenizer.json");
    const std::u32string text = unicode::decode_utf8(bytes.substr(nul + 1), "test");
    Regex::Budget budget = Regex::budget_for(text.size());
    size_t from = 0, b = 0, e = 0;
    while (from <= text.size() && re.search(text, from, b, e, budget)) from = e > b ? e : e + 1;
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Patterns come from tokenizer.json files; these were found by review of the regex engine when it joined
// the fuzz targets. 100000 nested groups or stacked quantifiers overflowed the stack (the parser, the
// emitter and the tree's destructor recurse); intervals nested three deep compiled to 10^9 instructions.
TEST(TokenizerFuzzRegressions, RegexNestingAndSizeAreBounded) {
  EXPECT_TRUE(kiln::testing::has_all(regex_outcome("groups-nested-100000-deep"),
                                     {"tokenizer.json: regex", "groups nested more than 100 deep"}));
  EXPECT_TRUE(kiln::testing::has_all(regex_outcome("quantifiers-stacked-100000-deep"),
                                     {"groups and quantifiers nested more than 100 deep"}));
  EXPECT_TRUE(kiln::testing::has_all(regex_outcome("intervals-multiply-to-10-to-the-9"),
                                     {"compiles to more than 262144 instructions"}));
}

// (a+)+b on 64 a's backtracks 2^64 ways and .*x rescans a 16K text from every start (2.7e8 steps): each
// ends with an error once the budget of its pass is spent, quickly, instead of hanging.
TEST(TokenizerFuzzRegressions, RegexBacktrackingIsBounded) {
  for (const char* name : {"nested-repeat-backtracks-exponentially", "quadratic-scan-of-16k-text"}) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(kiln::testing::has_all(regex_outcome(name), {"tokenizer.json: regex", "gave up"})) << name;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0) << name;
  }
}

// Real patterns stay far inside the budget on the longest prompt a pipeline takes (64 KB), whatever it holds.
TEST(TokenizerFuzzRegressions, RealPatternsFitTheBudgetOnLongPrompts) {
  const Regex re = Regex::compile(
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      "qwen");
  for (const std::u32string& text :
       {std::u32string(65536, U'a'), std::u32string(65536, U' '), std::u32string(65536, U'!'),
        std::u32string(32768, U' ') + std::u32string(32768, U'\n'), std::u32string(65536, U'1')}) {
    Regex::Budget budget = Regex::budget_for(text.size());
    size_t from = 0, b = 0, e = 0, matches = 0;
    while (from <= text.size() && re.search(text, from, b, e, budget)) {
      from = e > b ? e : e + 1;
      ++matches;
    }
    EXPECT_GT(matches, 0u);
    EXPECT_GT(budget.steps, Regex::budget_for(text.size()).steps / 2) << "used more than half the budget";
  }
}

}  // namespace
}  // namespace kiln::tokenizers
