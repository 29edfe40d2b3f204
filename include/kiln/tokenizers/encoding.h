// The result of tokenising one prompt: what a text encoder takes as input_ids (and, for models that use it,
// attention_mask).
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::tokenizers {

struct Encoding {
  std::vector<int64_t> ids;
  // 1 for real tokens (special tokens included), 0 for padding; same length as ids.
  std::vector<int64_t> attention_mask;
};

// How encode() sizes its output, as transformers' `padding` / `truncation` / `max_length` arguments do.
struct EncodeOptions {
  // Upper bound on the number of ids, special tokens included; <= 0 means the tokenizer's model_max_length.
  int64_t max_length = 0;
  // Cut the text tokens so that the sequence fits max_length; the special tokens (BOS/EOS) are kept.
  bool truncation = true;
  // Pad on the right with the pad id up to max_length (padding="max_length").
  bool pad_to_max_length = true;
};

}  // namespace kiln::tokenizers
