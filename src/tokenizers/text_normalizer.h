// A chain of text normalisers as HF tokenizers defines them (tokenizer.json "normalizer"): Sequence, NFC,
// NFD, Lowercase, Strip, Replace (literal or a small regex subset) and Precompiled (SentencePiece charsmaps).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizers/normalized_text.h"
#include "tokenizers/precompiled_charsmap.h"

namespace kiln::tokenizers {

// The regexes tokenizer.json files put in Replace normalisers: one atom (a character, an escaped character or
// \s) with an optional quantifier (+, {n}, {n,}, {n,m}). Anything else is rejected when the file is loaded.
class SimplePattern {
 public:
  static SimplePattern literal(std::string text);
  static SimplePattern regex(std::string_view pattern, const std::string& source);
  // Finds the leftmost match at or after byte `from`; returns false when there is none.
  bool find(std::string_view text, size_t from, size_t& begin, size_t& end) const;

 private:
  std::string literal_;
  bool is_regex_ = false;
  bool atom_is_space_class_ = false;  // \s
  char32_t atom_ = 0;
  size_t min_ = 1, max_ = 1;
};

class TextNormalizer {
 public:
  // Identity normaliser.
  TextNormalizer() = default;
  // From a tokenizer.json "normalizer" value (null means identity); `source` names the file.
  static TextNormalizer from_json(const nlohmann::json& j, const std::string& source);

  void add_nfc();
  void add_lowercase();
  void add_replace(SimplePattern pattern, std::string content);
  void add_precompiled(std::shared_ptr<const PrecompiledCharsmap> charsmap);

  NormalizedText normalize(NormalizedText text) const;
  std::string normalize(std::string_view text) const {
    return normalize(NormalizedText(std::string(text), 0)).text;
  }

 private:
  struct Step;
  void add_from_json(const nlohmann::json& j, const std::string& source);
  std::vector<std::shared_ptr<const Step>> steps_;
};

}  // namespace kiln::tokenizers
