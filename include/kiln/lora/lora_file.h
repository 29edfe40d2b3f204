// A LoRA file (.safetensors) read for one pipeline: each pair of its layout (kiln/lora/lora_keys.h) with its
// tensors and scale, matched to the pipeline's layers and checked against their shapes.
//
// The scale of a pair is alpha / rank, as diffusers applies it:
//   - kohya, Black Forest Labs, XLabs: the pair's own .alpha tensor (none: alpha = rank, scale 1);
//   - diffusers (PEFT): PEFT's LoraConfig as diffusers builds it: when a component has .alpha tensors, a
//   module
//     without one takes the component's "most common" alpha, which is the first in the file (diffusers counts
//     the alpha tensors by identity, so each is counted once); without any, the file's lora_adapter_metadata
//     (lora_alpha, alpha_pattern, use_rslora: alpha / sqrt(rank)) and otherwise alpha = rank.
// A family may take a transformer down narrower than its layer, padded with zeros
// (LoraFamily::pads_narrow_down).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/lora/lora_keys.h"

namespace kiln::nn {
class LoraLayer;
}

namespace kiln::lora {

// One layer's share of a pair: the whole layer's down and up, a Linear's [rank, in_features] and
// [out_features, rank], a convolution's [rank, in, k, k] and [out, rank, 1, 1] (kiln/nn/lora_layer.h).
struct LayerAdapter {
  LoraTarget target;
  nn::LoraLayer* layer = nullptr;
  Tensor down, up;
  double scale = 1.0;  // alpha / rank
  std::string source;  // the pair's module as the file names it
};

struct LoraContents {
  LoraFormat format = LoraFormat::Diffusers;
  std::vector<LayerAdapter> layers;
  std::vector<std::pair<std::string, std::string>> skipped;  // (tensor or pair, why), in file order
};

// A component's layer that takes LoRA (an nn::Linear or nn::Conv2d) by its diffusers module name; nullptr
// when it has none of that name.
using LayerLookup = std::function<nn::LoraLayer*(const std::string& component, const std::string& module)>;

// Reads `path` for a pipeline of `family` whose layers `find` gives. A pair that fits no layer (a name no
// layout rule accounts for, a layer the model lacks, a shape or rank that does not match) is an error naming
// the file, the first such tensor in file order and what was expected, unless `ignore_mismatches`: it is then
// skipped and reported in `skipped`. Tensors diffusers ignores too (DoRA scales, T5 LoRA) are always skipped.
LoraContents read_lora_file(const std::string& path, const LoraFamily& family, const LayerLookup& find,
                            bool ignore_mismatches = false);

}  // namespace kiln::lora
