// A BPE tokenizer read from a tokenizers-library tokenizer.json, as transformers' TokenizersBackend runs it
// (the fast tokenizers of Mistral's Tekken vocabulary, Qwen2/Qwen3, Llama 3, GPT-2):
//   1. added tokens (special or not) are cut out of the raw text (or out of the normalised text, for those
//   marked
//      `normalized`), leftmost-longest;
//   2. the rest is normalised (tokenizer.json "normalizer": NFC, NFD, Lowercase, Strip, Replace, ...);
//   3. pre-tokenised ("pre_tokenizer": Split with the file's regex, ByteLevel, in a Sequence);
//   4. each piece is encoded by the BPE model (byte fallback, unk and ignore_merges as the file configures);
//   5. the post-processor adds its special tokens when add_special_tokens is set: the file's
//   TemplateProcessing
//      (or none for ByteLevel), unless tokenizer_config.json sets add_bos_token / add_eos_token, which make
//      transformers rebuild it as "[bos] $A [eos]";
//   6. truncation keeps the special tokens and cuts text tokens on the right; padding with the pad token on
//   the
//      tokenizer's padding side (tokenizer_config.json "padding_side", default right).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/tokenizers/encoding.h"

namespace kiln::tokenizers {

enum class PaddingSide { Right, Left };

struct BpeEncodeOptions : EncodeOptions {
  // Let the post-processor add its special tokens (transformers' add_special_tokens).
  bool add_special_tokens = true;
};

class BpeTokenizer {
 public:
  // `dir`/tokenizer.json, with tokenizer_config.json and special_tokens_map.json when present.
  static BpeTokenizer from_directory(const std::filesystem::path& dir);
  // The config paths may be empty or name missing files.
  static BpeTokenizer from_files(const std::filesystem::path& tokenizer_json,
                                 const std::filesystem::path& tokenizer_config = {},
                                 const std::filesystem::path& special_tokens_map = {});

  // Tokenises one text as transformers' tokenizer(text, padding="max_length", truncation=True,
  // max_length=...) does (each of those as `options` sets it).
  Encoding encode(std::string_view text, const BpeEncodeOptions& options = {}) const;
  // Ids of the text without special tokens, truncation or padding.
  std::vector<int64_t> tokenize(std::string_view text) const;

  // The special tokens tokenizer_config.json / special_tokens_map.json name (empty when unset) and their ids.
  const std::string& bos_token() const;
  std::optional<int64_t> bos_id() const;
  std::optional<int64_t> eos_id() const;
  // Padding needs a pad token: encode with pad_to_max_length fails without one.
  std::optional<int64_t> pad_id() const;
  PaddingSide padding_side() const;
  int64_t model_max_length() const;
  // Base vocabulary plus added tokens.
  size_t vocab_size() const;
  // Id of an added token or vocabulary entry (in the byte-level alphabet for byte-level vocabularies); -1
  // when absent.
  int64_t token_to_id(std::string_view token) const;

  ~BpeTokenizer();
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;

 private:
  struct Impl;
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::tokenizers
