#include "kiln/nn/gguf_weights.h"

namespace kiln::nn {

GgufWeights::GgufWeights(const std::string& path) : file_(std::make_shared<io::GgufFile>(path)) {}

bool GgufWeights::contains(const std::string& name) const {
  return file_->contains(name);
}
Shape GgufWeights::shape(const std::string& name) const {
  return file_->info(name).shape;
}
Tensor GgufWeights::load(const std::string& name) const {
  return file_->tensor(name);
}
std::vector<std::string> GgufWeights::names() const {
  return file_->names();
}
std::string GgufWeights::description() const {
  return file_->path();
}
quant::QuantizedTensor GgufWeights::load_quantized(const std::string& name) const {
  if (!quant::traits(file_->info(name).type).is_quantized) return {};
  return file_->blocks(name);
}

}  // namespace kiln::nn
