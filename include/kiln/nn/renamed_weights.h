// A WeightSource that shows another source's tensors under different names: for checkpoints whose naming
// differs between library versions (transformers 5 saves CLIP without the "text_model." prefix that the
// real FLUX and SD3 repos have).
#pragma once

#include <functional>

#include "kiln/nn/module.h"

namespace kiln::nn {

class RenamedWeights final : public WeightSource {
 public:
  // `to_model` maps a checkpoint name to the model's name for it.
  RenamedWeights(const WeightSource& inner, std::function<std::string(const std::string&)> to_model);

  bool contains(const std::string& name) const override;
  Shape shape(const std::string& name) const override;
  Tensor load(const std::string& name) const override;
  std::vector<std::string> names() const override;
  std::string description() const override { return inner_.description(); }
  quant::QuantizedTensor load_quantized(const std::string& name) const override;

 private:
  const std::string& checkpoint_name(const std::string& model_name) const;

  const WeightSource& inner_;
  std::vector<std::pair<std::string, std::string>> model_to_checkpoint_;  // sorted by model name
};

}  // namespace kiln::nn
