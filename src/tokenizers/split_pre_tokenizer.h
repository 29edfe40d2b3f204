// The pre-tokenisers of byte-level BPE tokenizer.json files (GPT-2, Llama 3, Qwen, Mistral's Tekken): Split
// with a regex or a literal (behaviours Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous;
// invert), ByteLevel (optional prefix space, GPT-2's split pattern when use_regex, then every byte mapped to
// its printable character), in a Sequence or alone. Pieces keep their original offsets, so later steps can
// tell where they came from.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizers/normalized_text.h"
#include "tokenizers/regex.h"

namespace kiln::tokenizers {

class SplitPreTokenizer {
 public:
  enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

  // From a tokenizer.json "pre_tokenizer" value (null: the whole text is one piece).
  static SplitPreTokenizer from_json(const nlohmann::json& j, const std::string& source);

  // Pieces of `text`, empty ones dropped. A ByteLevel step leaves each piece's text in the byte-level
  // alphabet.
  std::vector<NormalizedText> pre_tokenize(const NormalizedText& text) const;

 private:
  struct Step {
    enum class Kind { Split, ByteLevel } kind = Kind::Split;
    std::shared_ptr<const Regex> regex;  // Split with a regex, or ByteLevel with use_regex
    std::string literal;                 // Split with a string pattern
    Behavior behavior = Behavior::Isolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel
  };
  void add_from_json(const nlohmann::json& j, const std::string& source);
  static std::vector<NormalizedText> split(const NormalizedText& piece, const Step& step,
                                           Regex::Budget& budget);
  static NormalizedText byte_level(const NormalizedText& piece);

  std::vector<Step> steps_;
};

}  // namespace kiln::tokenizers
