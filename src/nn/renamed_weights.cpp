#include "kiln/nn/renamed_weights.h"

#include <algorithm>

namespace kiln::nn {

RenamedWeights::RenamedWeights(const WeightSource& inner,
                               std::function<std::string(const std::string&)> to_model)
    : inner_(inner) {
  for (const auto& name : inner.names()) model_to_checkpoint_.emplace_back(to_model(name), name);
  std::sort(model_to_checkpoint_.begin(), model_to_checkpoint_.end());
}

const std::string& RenamedWeights::checkpoint_name(const std::string& model_name) const {
  auto it = std::lower_bound(model_to_checkpoint_.begin(), model_to_checkpoint_.end(), model_name,
                             [](const auto& entry, const std::string& key) { return entry.first < key; });
  KILN_CHECK(it != model_to_checkpoint_.end() && it->first == model_name,
             inner_.description() << ": no tensor named '" << model_name << "'");
  return it->second;
}

bool RenamedWeights::contains(const std::string& name) const {
  auto it = std::lower_bound(model_to_checkpoint_.begin(), model_to_checkpoint_.end(), name,
                             [](const auto& entry, const std::string& key) { return entry.first < key; });
  return it != model_to_checkpoint_.end() && it->first == name;
}

Shape RenamedWeights::shape(const std::string& name) const {
  return inner_.shape(checkpoint_name(name));
}
Tensor RenamedWeights::load(const std::string& name) const {
  return inner_.load(checkpoint_name(name));
}

quant::QuantizedTensor RenamedWeights::load_quantized(const std::string& name) const {
  return inner_.load_quantized(checkpoint_name(name));
}

std::vector<std::string> RenamedWeights::names() const {
  std::vector<std::string> out;
  out.reserve(model_to_checkpoint_.size());
  for (const auto& [model, checkpoint] : model_to_checkpoint_) out.push_back(model);
  return out;
}

}  // namespace kiln::nn
