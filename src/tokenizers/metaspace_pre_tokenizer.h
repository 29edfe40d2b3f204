// The pre-tokenisers SentencePiece-style tokenizer.json files use: WhitespaceSplit (split on Unicode
// whitespace, dropping it) and Metaspace (spaces become "▁", "▁" is prepended per prepend_scheme, and the
// text is cut before each "▁"), in a Sequence or alone.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizers/normalized_text.h"

namespace kiln::tokenizers {

class MetaspacePreTokenizer {
 public:
  enum class Prepend { Always, First, Never };
  struct Step {
    enum class Kind { WhitespaceSplit, Metaspace } kind;
    std::string replacement = "\xE2\x96\x81";  // U+2581
    Prepend prepend = Prepend::Always;
    bool split = true;
  };

  // T5's: WhitespaceSplit, then Metaspace("▁", always, split).
  static MetaspacePreTokenizer t5_default();
  // From a tokenizer.json "pre_tokenizer" value (null: the whole text is one piece).
  static MetaspacePreTokenizer from_json(const nlohmann::json& j, const std::string& source);

  std::vector<NormalizedText> pre_tokenize(const NormalizedText& text) const;

 private:
  void add_from_json(const nlohmann::json& j, const std::string& source);
  std::vector<Step> steps_;
};

}  // namespace kiln::tokenizers
