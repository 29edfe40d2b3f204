// The pre-tokenizer regex engine: Oniguruma's semantics on the constructs tokenizer.json patterns use. The
// expected splits are what HF tokenizers' Split(pattern, "isolated") returns (checked with the tokenizers
// package); the full tokenizers are compared with transformers in bpe_tokenizer_test.cpp.
#include <gtest/gtest.h>

#include "kiln/core/error.h"
#include "tokenizers/regex.h"
#include "tokenizers/unicode.h"

namespace kiln::tokenizers {
namespace {

constexpr const char* kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> find_all(const Regex& re, const std::string& text) {
  const std::u32string t = unicode::decode_utf8(text, "test");
  std::vector<std::string> out;
  size_t from = 0, b = 0, e = 0;
  while (re.search(t, from, b, e)) {
    out.push_back(unicode::encode_utf8(t.substr(b, e - b)));
    from = e > b ? e : e + 1;
  }
  return out;
}

TEST(Regex, QwenPatternSplitsAsTokenizers) {
  const Regex re = Regex::compile(kQwenPattern, "test");
  EXPECT_EQ(find_all(re, "don'\u017Ft"), (std::vector<std::string>{"don", "'\u017F", "t"}));
  EXPECT_EQ(find_all(re, "DON'T"), (std::vector<std::string>{"DON", "'T"}));
  EXPECT_EQ(find_all(re, "I'LL 'Ll"), (std::vector<std::string>{"I", "'LL", " '", "Ll"}));
  EXPECT_EQ(find_all(re, "a  b\n\n c"), (std::vector<std::string>{"a", " ", " b", "\n\n", " c"}));
  EXPECT_EQ(find_all(re, "e\u0301t\u00e9"), (std::vector<std::string>{"e", "\u0301t\u00e9"}));
  EXPECT_EQ(find_all(re, "123"), (std::vector<std::string>{"1", "2", "3"}));
  EXPECT_EQ(find_all(re, "\u3000x\u00a0y"), (std::vector<std::string>{"\u3000x", "\u00a0y"}));
  EXPECT_EQ(find_all(re, "  "), (std::vector<std::string>{"  "}));
  // Letters new in Unicode 15.0 (Kawi, CJK Ext H) and 16.0 (Ol Onal) are \p{L} for Oniguruma, a 15.0 spacing
  // mark is not (the tables follow the tokenizers package's Oniguruma, not an older unicodedata).
  EXPECT_EQ(
      find_all(re, "a\U00011F04b \U00031350x \U0001E5D0\U0001E5D1 \u0CF3z"),
      (std::vector<std::string>{"a\U00011F04b", " \U00031350x", " \U0001E5D0\U0001E5D1", " \u0CF3", "z"}));
}

TEST(Regex, QuantifiersLookaheadAndAtomicGroups) {
  EXPECT_EQ(find_all(Regex::compile(R"(\p{N}{1,3})", "t"), "1234567"),
            (std::vector<std::string>{"123", "456", "7"}));
  EXPECT_EQ(find_all(Regex::compile(R"(a{2,}?)", "t"), "aaaaa"), (std::vector<std::string>{"aa", "aa"}));
  EXPECT_EQ(find_all(Regex::compile(R"(\s+(?!\S)|\s+)", "t"), "a   b"),
            (std::vector<std::string>{"  ", " "}));
  EXPECT_EQ(find_all(Regex::compile(R"(a(?=b))", "t"), "aab ab"), (std::vector<std::string>{"a", "a"}));
  // A possessive quantifier never gives back: "a++a" cannot match.
  EXPECT_TRUE(find_all(Regex::compile(R"(a++a)", "t"), "aaaa").empty());
  EXPECT_EQ(find_all(Regex::compile(R"(a+a)", "t"), "aaaa"), (std::vector<std::string>{"aaaa"}));
  EXPECT_EQ(find_all(Regex::compile(R"((?>a|ab)c)", "t"), "abc ac"), (std::vector<std::string>{"ac"}));
  EXPECT_EQ(find_all(Regex::compile(R"([\p{Lu}\p{Lt}]+[\p{Ll}]*)", "t"), "McDonald eBay"),
            (std::vector<std::string>{"Mc", "Donald", "Bay"}));
  EXPECT_EQ(find_all(Regex::compile(R"([^a-c\d]+)", "t"), "xabyz12w"),
            (std::vector<std::string>{"x", "yz", "w"}));
  EXPECT_EQ(find_all(Regex::compile(R"(\x41\u00e9\x{1F600}\.)", "t"), "A\u00e9\U0001F600."),
            (std::vector<std::string>{"A\u00e9\U0001F600."}));
}

TEST(Regex, LongInputsDoNotExhaustTheStack) {
  const Regex re = Regex::compile(kQwenPattern, "t");
  const std::u32string spaces(200000, U' ');
  size_t b = 0, e = 0;
  ASSERT_TRUE(re.search(spaces, 0, b, e));
  EXPECT_EQ(b, 0u);
  EXPECT_EQ(e, spaces.size());
}

TEST(Regex, UnsupportedConstructsAreNamed) {
  auto message = [](const char* pattern) {
    try {
      Regex::compile(pattern, "file.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("^a").find("anchors"), std::string::npos);
  EXPECT_NE(message("(?<=a)b").find("lookbehind"), std::string::npos);
  EXPECT_NE(message("(a").find("missing ')'"), std::string::npos);
  EXPECT_NE(message("a)").find("unbalanced"), std::string::npos);
  EXPECT_NE(message("[a").find("missing ']'"), std::string::npos);
  EXPECT_NE(message("\\p{Xx}").find("unknown property"), std::string::npos);
  EXPECT_NE(message("(a*)*").find("can match empty"), std::string::npos);
  EXPECT_NE(message("\\1").find("unsupported escape"), std::string::npos);
  EXPECT_NE(message("(?i:[a-z])").find("case-insensitive class"), std::string::npos);
  EXPECT_NE(message("*a").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(message("x").find("no error"), std::string::npos);
  EXPECT_NE(message("(?<=a)b").find("file.json"), std::string::npos);
}

}  // namespace
}  // namespace kiln::tokenizers
