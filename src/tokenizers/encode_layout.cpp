#include "tokenizers/encode_layout.h"

#include <limits>

#include "kiln/core/error.h"

namespace kiln::tokenizers {

Encoding layout_encoding(std::vector<int64_t> text_ids, const std::vector<int64_t>& prefix,
                         const std::vector<int64_t>& suffix, int64_t pad_id, int64_t model_max_length,
                         const EncodeOptions& options, const char* who) {
  const int64_t max_length = options.max_length > 0 ? options.max_length : model_max_length;
  const auto specials = static_cast<int64_t>(prefix.size() + suffix.size());
  const bool bounded = max_length != std::numeric_limits<int64_t>::max();
  if (options.truncation && bounded) {
    KILN_CHECK(max_length >= specials, who << ": max_length " << max_length << " leaves no room for the "
                                           << specials << " special tokens");
    if (static_cast<int64_t>(text_ids.size()) > max_length - specials) {
      text_ids.resize(static_cast<size_t>(max_length - specials));
    }
  }
  Encoding e;
  e.ids.reserve(static_cast<size_t>(bounded ? std::max<int64_t>(max_length, 0) : 0));
  e.ids.insert(e.ids.end(), prefix.begin(), prefix.end());
  e.ids.insert(e.ids.end(), text_ids.begin(), text_ids.end());
  e.ids.insert(e.ids.end(), suffix.begin(), suffix.end());
  e.attention_mask.assign(e.ids.size(), 1);
  if (options.pad_to_max_length) {
    KILN_CHECK(bounded,
               who << ": padding to max_length needs a max_length (the tokenizer has no model_max_length)");
    while (static_cast<int64_t>(e.ids.size()) < max_length) {
      e.ids.push_back(pad_id);
      e.attention_mask.push_back(0);
    }
  }
  return e;
}

}  // namespace kiln::tokenizers
