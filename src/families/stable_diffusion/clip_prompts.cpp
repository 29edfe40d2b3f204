#include "families/stable_diffusion/clip_prompts.h"

#include "kiln/core/log.h"

namespace kiln {

Tensor clip_input_ids(const tokenizers::ClipTokenizer& tokenizer, const std::vector<std::string>& prompts) {
  const int64_t length = tokenizer.model_max_length();
  tokenizers::EncodeOptions options;
  options.max_length = length;
  std::vector<int64_t> ids;
  for (const std::string& prompt : prompts) {
    if (static_cast<int64_t>(tokenizer.tokenize(prompt).size()) + 2 > length)
      warn("the prompt is longer than CLIP's " + std::to_string(length) + " tokens and was truncated");
    const std::vector<int64_t> row = tokenizer.encode(prompt, options).ids;
    ids.insert(ids.end(), row.begin(), row.end());
  }
  return Tensor::from_vector(ids, {static_cast<int64_t>(prompts.size()), length});
}

}  // namespace kiln
