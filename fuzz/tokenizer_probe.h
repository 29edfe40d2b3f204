// The texts every tokenizer target runs through a tokenizer it managed to load, and the invariants of the
// result, so that a file that loads but leaves the tokenizer inconsistent is a finding too.
#pragma once

#include <string_view>
#include <type_traits>

#include "fuzz_support.h"
#include "kiln/tokenizers/bpe_tokenizer.h"
#include "kiln/tokenizers/encoding.h"

namespace kiln::fuzz {

inline constexpr std::string_view kProbeTexts[] = {
    "",
    "a photo of a cat",
    "A  Golden Retriever,\tsurfing a WAVE!! 123 don't",
    "<|startoftext|>x<|endoftext|> </s> <pad> <unk> <extra_id_0>",
    "caf\xC3\xA9 \xE2\x84\xAB \xEF\xAC\x81 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x90\x88 \xE2\x96\x81",
};

// encode(text) padded and truncated to max_length, in the options type of the tokenizer.
template <class Tokenizer>
tokenizers::Encoding encode_to(const Tokenizer& t, std::string_view text, int64_t max_length) {
  if constexpr (std::is_same_v<Tokenizer, tokenizers::BpeTokenizer>) {
    tokenizers::BpeEncodeOptions options;
    options.max_length = max_length;
    return t.encode(text, options);
  } else {
    return t.encode(text, {.max_length = max_length});
  }
}

// Tokenises the probe texts (and `extra`) with `t`, checking that encode() gives equal-length ids and mask of
// at most `max_length` entries, padded to it, and ids inside the vocabulary plus added tokens.
template <class Tokenizer>
void probe_tokenizer(const Tokenizer& t, std::string_view extra = {}) {
  for (int i = 0; i <= static_cast<int>(std::size(kProbeTexts)); ++i) {
    const std::string_view text = i < static_cast<int>(std::size(kProbeTexts)) ? kProbeTexts[i] : extra;
    expect_clean([&] {
      for (int64_t max_length : {int64_t{1}, int64_t{16}}) {
        const tokenizers::Encoding e = encode_to(t, text, max_length);
        require(e.ids.size() == e.attention_mask.size(), "ids and attention mask differ in length");
        require(e.ids.size() == static_cast<size_t>(max_length), "not padded or truncated to max_length");
      }
      t.tokenize(text);
    });
  }
}

}  // namespace kiln::fuzz
