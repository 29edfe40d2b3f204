// T5's SentencePiece Unigram tokenizer (FLUX `tokenizer_2/`, SD3 `tokenizer_3/`), matching transformers'
// T5TokenizerFast (and, in transformers >= 5, T5Tokenizer, the same class):
//   1. added tokens (<pad>, </s>, <unk>, <extra_id_0..99>) are cut out of the raw text;
//   2. the rest is normalised (SentencePiece's precompiled charsmap, NFKC-like, applied per grapheme
//   cluster);
//   3. pre-tokenised: split on whitespace, "▁" prepended to each word (Metaspace);
//   4. each word is segmented by Viterbi over the Unigram piece scores (unknown characters -> <unk>);
//   5. </s> is appended; truncation keeps it; padding uses <pad> (0).
// From a folder, tokenizer.json is preferred (it is what T5TokenizerFast loads; its normaliser and
// pre-tokeniser are read generically), else spiece.model is converted the way transformers converts it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/tokenizers/encoding.h"

namespace kiln::tokenizers {

class T5Tokenizer {
 public:
  // tokenizer.json if present, else spiece.model; tokenizer_config.json / special_tokens_map.json when
  // present give the pad/eos/unk tokens and model_max_length (default 512).
  static T5Tokenizer from_directory(const std::filesystem::path& dir);
  // A tokenizers-library tokenizer.json with a Unigram model; config files as in from_directory (optional).
  static T5Tokenizer from_tokenizer_json(const std::filesystem::path& tokenizer_json,
                                         const std::filesystem::path& tokenizer_config = {},
                                         const std::filesystem::path& special_tokens_map = {});
  // A SentencePiece Unigram model (spiece.model), with `extra_ids` sentinels <extra_id_{extra_ids-1}> ...
  // <extra_id_0> appended to the vocabulary as special tokens.
  static T5Tokenizer from_sentencepiece(const std::filesystem::path& spiece_model, int64_t extra_ids = 100,
                                        const std::filesystem::path& tokenizer_config = {},
                                        const std::filesystem::path& special_tokens_map = {});

  // Tokenises one prompt: [text tokens..., eos, pad...], as transformers does with padding="max_length",
  // truncation=True and max_length (FLUX: max_sequence_length; default: model_max_length).
  Encoding encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Text tokens only, without EOS, truncation or padding.
  std::vector<int64_t> tokenize(std::string_view text) const;

  int64_t eos_id() const;
  int64_t pad_id() const;
  int64_t unk_id() const;
  int64_t model_max_length() const;
  size_t vocab_size() const;
  // -1 when the piece is not in the vocabulary.
  int64_t token_to_id(std::string_view piece) const;

  ~T5Tokenizer();
  T5Tokenizer(T5Tokenizer&&) noexcept;
  T5Tokenizer& operator=(T5Tokenizer&&) noexcept;

 private:
  struct Impl;
  explicit T5Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::tokenizers
