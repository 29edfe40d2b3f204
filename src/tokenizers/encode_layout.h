// The last step shared by the tokenizers: truncate the text ids so that the special tokens still fit, wrap
// them in the prefix/suffix specials (post-processor) and pad on the right, as transformers does for
// truncation=True, padding="max_length".
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/tokenizers/encoding.h"

namespace kiln::tokenizers {

// `model_max_length` applies when options.max_length <= 0; `who` names the caller in errors.
Encoding layout_encoding(std::vector<int64_t> text_ids, const std::vector<int64_t>& prefix,
                         const std::vector<int64_t>& suffix, int64_t pad_id, int64_t model_max_length,
                         const EncodeOptions& options, const char* who);

}  // namespace kiln::tokenizers
