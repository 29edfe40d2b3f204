#include "kiln/nn/weight_file.h"

#include <filesystem>

#include "kiln/nn/checkpoint_weights.h"
#include "kiln/nn/gguf_weights.h"

namespace kiln::nn {

std::unique_ptr<WeightSource> open_weight_file(const std::string& path) {
  KILN_CHECK(std::filesystem::is_regular_file(path),
             path << ": no such file (expected a .safetensors or .gguf file)");
  if (std::filesystem::path(path).extension() == ".gguf") return std::make_unique<GgufWeights>(path);
  return std::make_unique<CheckpointWeights>(path);
}

}  // namespace kiln::nn
