// What transformers reads from tokenizer_config.json and special_tokens_map.json: the special tokens (bos,
// eos, unk, pad, each a string or an AddedToken dict), added_tokens_decoder, model_max_length, and for the
// tokenizers-backed classes padding_side, truncation_side, add_bos_token and add_eos_token.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tokenizers/added_vocabulary.h"

namespace kiln::tokenizers {

struct TokenizerConfig {
  // "bos_token", "eos_token", "unk_token", "pad_token" -> token (id unset: the caller resolves it).
  std::map<std::string, AddedToken> special_tokens;
  std::vector<AddedToken> added_tokens;  // from added_tokens_decoder, ids set
  std::optional<int64_t> model_max_length;
  std::optional<std::string> padding_side;     // "left" or "right"
  std::optional<std::string> truncation_side;  // "left" or "right"
  std::optional<bool> add_bos_token, add_eos_token;

  // Either path may be empty or name a missing file; special_tokens_map.json overrides tokenizer_config.json.
  static TokenizerConfig load(const std::filesystem::path& tokenizer_config,
                              const std::filesystem::path& special_tokens_map);
  const AddedToken* special(const std::string& key) const;

 private:
  static TokenizerConfig load_files(const std::filesystem::path& tokenizer_config,
                                    const std::filesystem::path& special_tokens_map);
};

}  // namespace kiln::tokenizers
