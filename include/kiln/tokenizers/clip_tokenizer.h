// CLIP's byte-level BPE tokenizer (FLUX/SD3 `tokenizer/`, `tokenizer_2/`), matching transformers'
// CLIPTokenizer (the tokenizers-backed one, transformers >= 5, identical to the former CLIPTokenizerFast):
//   1. special tokens (<|startoftext|>, <|endoftext|>, the pad token, anything in added_tokens_decoder) are
//   cut
//      out first;
//   2. the rest is normalised: NFC, every whitespace run -> one space, full Unicode lower-casing. ftfy is not
//      applied (transformers' fast path never did; only the old Python tokenizer used it when installed);
//   3. pre-tokenised with CLIP's pattern: <|startoftext|>, <|endoftext|>, 's 't 're 've 'm 'll 'd, letter
//   runs,
//      single digits, runs of other non-space characters; whitespace is dropped;
//   4. each piece's UTF-8 bytes map to printable characters (GPT-2 bytes_to_unicode) and go through BPE with
//      merge ranks from merges.txt and "</w>" on the last symbol;
//   5. <|startoftext|> ... <|endoftext|> are added; truncation keeps both; padding uses the configured pad id
//      (49407 for CLIP-L in FLUX; 0, i.e. "!", for SD3's CLIP-G).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/tokenizers/encoding.h"

namespace kiln::tokenizers {

class ClipTokenizer {
 public:
  struct Files {
    std::filesystem::path vocab;   // vocab.json: {"token": id}
    std::filesystem::path merges;  // merges.txt: optional "#version" line, then "a b" per line
    // Optional (empty path or missing file: CLIP defaults): special tokens, added tokens, model_max_length.
    std::filesystem::path tokenizer_config;    // tokenizer_config.json
    std::filesystem::path special_tokens_map;  // special_tokens_map.json (overrides tokenizer_config)
  };

  // Loads `dir`/vocab.json, merges.txt and, when present, tokenizer_config.json and special_tokens_map.json.
  static ClipTokenizer from_directory(const std::filesystem::path& dir);
  static ClipTokenizer from_files(const Files& files);

  // Tokenises one prompt: [bos, text tokens..., eos, pad...] as transformers does with
  // padding="max_length", truncation=True, max_length (default: model_max_length).
  Encoding encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Text tokens only, without BOS/EOS, truncation or padding.
  std::vector<int64_t> tokenize(std::string_view text) const;

  int64_t bos_id() const;
  int64_t eos_id() const;
  int64_t pad_id() const;
  int64_t model_max_length() const;
  size_t vocab_size() const;
  // -1 when the token is not in the vocabulary.
  int64_t token_to_id(std::string_view token) const;

  ~ClipTokenizer();
  ClipTokenizer(ClipTokenizer&&) noexcept;
  ClipTokenizer& operator=(ClipTokenizer&&) noexcept;

 private:
  struct Impl;
  explicit ClipTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::tokenizers
