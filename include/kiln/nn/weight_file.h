// Opens one checkpoint file as a WeightSource by its format: .gguf through nn::GgufWeights, anything else as
// safetensors (nn::CheckpointWeights).
#pragma once

#include <memory>
#include <string>

#include "kiln/nn/module.h"

namespace kiln::nn {

std::unique_ptr<WeightSource> open_weight_file(const std::string& path);

}  // namespace kiln::nn
