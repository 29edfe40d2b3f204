// WeightSource over a GGUF file. Tensors keep the file's names and report torch-order shapes; load() gives
// plain floats (F32/F16/BF16 as zero-copy views, quantized types dequantized), load_quantized() the raw
// blocks of quantized tensors, so Linear weights stay quantized in memory (nn::LoadOptions::keep_quantized).
// Tensors that ComfyUI-GGUF stored reshaped (metadata comfy.gguf.orig_shape.<name>) report and load with
// their real shape.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "kiln/io/gguf.h"
#include "kiln/nn/module.h"

namespace kiln::nn {

class GgufWeights final : public WeightSource {
 public:
  explicit GgufWeights(const std::string& path);

  bool contains(const std::string& name) const override;
  Shape shape(const std::string& name) const override;
  Tensor load(const std::string& name) const override;
  std::vector<std::string> names() const override;
  std::string description() const override;
  quant::QuantizedTensor load_quantized(const std::string& name) const override;
  const io::GgufFile& file() const { return *file_; }

 private:
  std::shared_ptr<io::GgufFile> file_;
  std::map<std::string, Shape> original_shapes_;
};

}  // namespace kiln::nn
