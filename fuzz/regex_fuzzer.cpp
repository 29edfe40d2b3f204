// The regex engine of tokenizer.json pre-tokenizers (src/tokenizers/regex.h): the input is a pattern and a
// text separated by a NUL byte. A pattern that compiles is searched over the text the way a Split
// pre-tokenizer walks it, match after match, under one budget; every match must lie inside the text, start
// at or after where the search began and end at or after its start. Patterns come from downloaded files, so
// the compiler's nesting and size limits and the matcher's budget are what keep a bad one from crashing
// Kiln or hanging it.
#include "fuzz_support.h"
#include "tokenizers/regex.h"
#include "tokenizers/unicode.h"

using namespace kiln;

namespace {

// The text as code points: UTF-8 when valid, otherwise each byte as the code point of the same value, so
// that every input reaches the matcher.
std::u32string code_points(std::string_view bytes) {
  try {
    return tokenizers::unicode::decode_utf8(bytes, "regex fuzz text");
  } catch (const Error&) {
    std::u32string text;
    for (unsigned char c : bytes) text.push_back(c);
    return text;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split({reinterpret_cast<const char*>(data), size}, std::string_view("\0", 1), 2);
  const std::u32string text = code_points(parts.size() > 1 ? parts[1] : std::string_view());
  fuzz::expect_clean([&] {
    const tokenizers::Regex re = tokenizers::Regex::compile(parts[0], "tokenizer.json");
    tokenizers::Regex::Budget budget = tokenizers::Regex::budget_for(text.size());
    size_t from = 0, begin = 0, end = 0;
    while (from <= text.size() && re.search(text, from, begin, end, budget)) {
      fuzz::require(begin >= from && begin <= end && end <= text.size(), "match outside the searched text");
      from = end > begin ? end : end + 1;
    }
  });
  return 0;
}
