#include "tokenizers/unicode.h"

#include <gtest/gtest.h>

#include "kiln/core/error.h"
#include "tokenizers/byte_level.h"
#include "tokenizers/precompiled_charsmap.h"
#include "tokenizers/sentencepiece_model.h"
#include "tokenizers/tokenizer_refs.h"

namespace kiln::tokenizers {
namespace {

using kiln::testing::tokenizer_refs;

TEST(TokenizerUnicodeTest, NfcLowercaseAndGraphemesMatchPython) {
  const auto& cases = tokenizer_refs()["unicode"];
  ASSERT_GT(cases.size(), 30u);
  for (const auto& c : cases) {
    const std::string text = c["text"];
    SCOPED_TRACE("\"" + text.substr(0, 60) + "\"");
    const std::u32string chars = unicode::decode_utf8(text, "test");
    EXPECT_EQ(unicode::encode_utf8(unicode::nfc(chars)), c["nfc"].get<std::string>());
    std::u32string lower;
    for (char32_t ch : chars) unicode::append_lowercase(lower, ch);
    EXPECT_EQ(unicode::encode_utf8(lower), c["lower"].get<std::string>());
    const std::vector<size_t> bounds = unicode::grapheme_boundaries(chars);
    std::vector<size_t> lengths;
    for (size_t i = 0; i + 1 < bounds.size(); ++i) lengths.push_back(bounds[i + 1] - bounds[i]);
    EXPECT_EQ(lengths, c["graphemes"].get<std::vector<size_t>>());
  }
}

TEST(TokenizerUnicodeTest, ClassifiesCharacters) {
  EXPECT_TRUE(unicode::is_letter(U'a'));
  EXPECT_TRUE(unicode::is_letter(U'東'));
  EXPECT_TRUE(unicode::is_letter(U'ß'));
  EXPECT_FALSE(unicode::is_letter(U'1'));
  EXPECT_TRUE(unicode::is_number(U'7'));
  EXPECT_TRUE(unicode::is_number(U'½'));
  EXPECT_TRUE(unicode::is_number(U'①'));
  EXPECT_FALSE(unicode::is_number(U'x'));
  for (char32_t c : {U' ', U'\t', U'\n', U'\u3000', U'\u00a0', U'\u0085', U'\u2028'}) {
    EXPECT_TRUE(unicode::is_white_space(c)) << static_cast<uint32_t>(c);
  }
  for (char32_t c : {U'\u200b', U'\u180e', U'\ufeff', U'\x1c'}) EXPECT_FALSE(unicode::is_white_space(c));
  EXPECT_EQ(unicode::properties(U'\u0301').combining_class, 230);
  EXPECT_FALSE(unicode::is_letter(0x110000));
}

TEST(TokenizerUnicodeTest, RejectsMalformedUtf8) {
  for (const std::string bad :
       {"\x80", "\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"}) {
    EXPECT_THROW(unicode::decode_utf8(bad, "test"), Error);
  }
  EXPECT_EQ(unicode::decode_utf8("\xf0\x9f\x90\xb1", "test"), std::u32string(U"\U0001F431"));
}

TEST(TokenizerUnicodeTest, ByteLevelAlphabet) {
  EXPECT_EQ(byte_level_encode("a!~"), "a!~");
  EXPECT_EQ(byte_level_encode(" "), "\xC4\xA0");                   // byte 32 -> U+0120 (the GPT-2 "Ġ")
  EXPECT_EQ(byte_level_encode(std::string(1, '\0')), "\xC4\x80");  // byte 0 -> U+0100
  EXPECT_EQ(byte_level_encode("\xAD"), "\xC5\x83");              // byte 173 -> U+0143, the last remapped byte
  EXPECT_EQ(byte_level_encode("\xC3\xA9"), "\xC3\x83\xC2\xA9");  // é's two bytes map to themselves
}

TEST(TokenizerUnicodeTest, PrecompiledCharsmapFromSpieceModel) {
  const SentencePieceModel m =
      SentencePieceModel::load(kiln::testing::tokenizer_fixture("t5") + "/spiece.model");
  const PrecompiledCharsmap map(m.precompiled_charsmap, "spiece.model");
  // nmt_nfkc: full-width to ASCII, ligature decomposed, no-break space to space, ASCII untouched.
  EXPECT_EQ(map.transform("\xEF\xBC\xA1").value_or("?"), "A");   // U+FF21
  EXPECT_EQ(map.transform("\xEF\xAC\x81").value_or("?"), "fi");  // U+FB01
  EXPECT_EQ(map.transform("\xC2\xA0").value_or("?"), " ");
  EXPECT_FALSE(map.transform("a").has_value());
  EXPECT_EQ(map.normalize(NormalizedText("\xEF\xBC\xA1\xEF\xBC\xA2 c", 0)).text, "AB c");
  EXPECT_THROW(PrecompiledCharsmap("\x10\x00\x00\x00", "bad"), Error);
}

}  // namespace
}  // namespace kiln::tokenizers
