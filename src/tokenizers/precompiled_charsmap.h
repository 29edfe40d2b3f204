// SentencePiece's precompiled normalisation map (nmt_nfkc and friends): a darts-clone double-array trie over
// UTF-8 keys whose values index a pool of NUL-terminated replacement strings. The same blob appears as
// NormalizerSpec.precompiled_charsmap in spiece.model and, base64-encoded, as the "Precompiled" normaliser
// of tokenizer.json. Normalisation follows HF tokenizers (what T5TokenizerFast runs), which differs from
// SentencePiece itself: it walks extended grapheme clusters and takes the first (shortest) trie match.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizers/normalized_text.h"

namespace kiln::tokenizers {

class PrecompiledCharsmap {
 public:
  // Validates the blob; `source` names the file for error messages.
  PrecompiledCharsmap(std::string_view blob, const std::string& source);

  // Replacement for the shortest key that is a prefix of chunk, if any.
  std::optional<std::string_view> transform(std::string_view chunk) const;
  NormalizedText normalize(const NormalizedText& in) const;

 private:
  std::vector<uint32_t> units_;
  std::string pool_;
};

}  // namespace kiln::tokenizers
