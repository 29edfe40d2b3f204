// `kiln info FILE.safetensors` for a LoRA file: its layout, ranks and alphas, and for each model family the
// layers it reaches (kiln/lora/lora_keys.h), grouped over the blocks.
#pragma once

#include <string>

namespace kiln::cli {

// Prints the LoRA summary of `path` and returns true, or returns false (printing nothing) when the file's
// tensors are not named like a LoRA's.
bool print_lora_info(const std::string& path);

}  // namespace kiln::cli
