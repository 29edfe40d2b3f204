// Added tokens (special tokens such as <|endoftext|>, </s>, <extra_id_0>): they are cut out of the text
// before the model sees it and map straight to their ids, as HF tokenizers' AddedVocabulary does. Tokens
// marked `normalized` are matched in the normalised text, the others in the raw text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizers/normalized_text.h"
#include "tokenizers/text_normalizer.h"

namespace kiln::tokenizers {

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = true;
};

// A piece of the input: either normalised text still to be tokenised, or an added token's id.
struct TextPiece {
  NormalizedText text;
  std::optional<int64_t> token_id;
};

class AddedVocabulary {
 public:
  // Adds or replaces (same content) a token.
  void add(AddedToken token);
  const AddedToken* find(std::string_view content) const;

  // Splits out added tokens and normalises what lies between them; empty pieces are dropped.
  std::vector<TextPiece> split(std::string_view text, const TextNormalizer& normalizer) const;

 private:
  struct Pattern {
    std::string text;  // what is searched for (the normalised content for normalized tokens)
    const AddedToken* token;
  };
  std::vector<TextPiece> split_one(const NormalizedText& text, const std::vector<Pattern>& patterns) const;
  std::vector<AddedToken> tokens_;
};

}  // namespace kiln::tokenizers
