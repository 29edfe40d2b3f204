// `kiln info FILE.gguf`: each tensor's storage type and shape, and the memory the file's quantized storage
// saves against the same tensors in bfloat16.
#pragma once

#include <string>

namespace kiln::cli {

void print_gguf_info(const std::string& path);

}  // namespace kiln::cli
