// FLUX.1 transformers saved as one file in Black Forest Labs' original layout (flux1-dev.safetensors, and
// the GGUF quantizations made from it), read as diffusers' FluxTransformer2DModel.from_single_file does:
// the same renames, the fused qkv (and single-block qkv+mlp) weights split by rows, and the final norm's
// (shift, scale) halves swapped to diffusers' (scale, shift). Splits and the swap work on whole rows, so
// block-quantized GGUF weights are split without being dequantized.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/models/flux_transformer.h"
#include "kiln/nn/module.h"

namespace kiln::models {

class FluxSingleFileWeights final : public nn::WeightSource {
 public:
  // `inner` holds the BFL names, optionally under "model.diffusion_model." (ComfyUI checkpoints; other
  // components in such a file are ignored). Throws kiln::Error naming the file and the first BFL tensor
  // that is missing or has a shape `config` does not expect.
  FluxSingleFileWeights(std::shared_ptr<const nn::WeightSource> inner, const FluxTransformerConfig& config);

  bool contains(const std::string& name) const override;
  Shape shape(const std::string& name) const override;
  Tensor load(const std::string& name) const override;
  quant::QuantizedTensor load_quantized(const std::string& name) const override;
  // The diffusers names, then any tensor of the file that maps to none (reported as unexpected).
  std::vector<std::string> names() const override;
  std::string description() const override;

  // Where one diffusers tensor comes from: rows [begin, end) of a file tensor, halves swapped or not.
  struct Entry {
    std::string source;
    int64_t begin = 0, end = -1;  // end -1: all rows
    bool swap_halves = false;
  };

 private:
  const Entry& entry(const std::string& name) const;

  std::shared_ptr<const nn::WeightSource> inner_;
  std::string prefix_;
  std::vector<std::pair<std::string, Entry>> entries_;  // sorted by diffusers name
  std::vector<std::string> unmapped_;
};

// The config of a FLUX.1 transformer read off a BFL-layout file's shapes (widths, depth, guidance), as
// diffusers picks a FLUX.1 config for such files. RoPE axes cannot be read off shapes: FLUX.1's (16, 56, 56)
// is used for 128-wide heads, and other head sizes are an error asking for a config.json.
FluxTransformerConfig infer_flux_config(const nn::WeightSource& bfl_weights);

}  // namespace kiln::models
