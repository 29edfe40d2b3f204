// CLIP's input ids as the UNet family's pipelines tokenize prompts: each padded to the tokenizer's
// model_max_length (77) and truncated there, with a warning that names the truncation.
#pragma once

#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/tokenizers/clip_tokenizer.h"

namespace kiln {

// [prompts, model_max_length] int64.
Tensor clip_input_ids(const tokenizers::ClipTokenizer& tokenizer, const std::vector<std::string>& prompts);

}  // namespace kiln
