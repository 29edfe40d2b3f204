// WeightSource over the safetensors files of one model folder (diffusers or transformers layout): a single
// file or shards listed by an *.safetensors.index.json.
#pragma once

#include <memory>
#include <string>

#include "kiln/nn/module.h"

namespace kiln::nn {

class CheckpointWeights final : public WeightSource {
 public:
  // `path` is a component folder (transformer/, text_encoder/, ...), a .safetensors file or an index.json.
  explicit CheckpointWeights(const std::string& path);
  ~CheckpointWeights() override;

  bool contains(const std::string& name) const override;
  Shape shape(const std::string& name) const override;
  Tensor load(const std::string& name) const override;
  // Reads only the slices' bytes: rows straight from the mapped file (zero-copy for one range along dim 0),
  // columns copied out row by row.
  Tensor load_slices(const std::string& name, int dim,
                     const std::vector<std::pair<int64_t, int64_t>>& ranges) const override;
  std::vector<std::string> names() const override;
  std::string description() const override;
  // An fp8 (F8_E4M3 or F8_E5M2) 2-D tensor as its stored bytes, so that Linear weights stay fp8 in memory
  // (nn::LoadOptions::keep_quantized); undefined for every other tensor.
  quant::QuantizedTensor load_quantized(const std::string& name) const override;
  // The dtype the checkpoint stores `name` in.
  DType stored_dtype(const std::string& name) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::nn
