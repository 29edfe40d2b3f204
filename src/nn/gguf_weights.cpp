#include "kiln/nn/gguf_weights.h"

#include <variant>

#include "kiln/core/error.h"

namespace kiln::nn {

namespace {

// ComfyUI-GGUF's key for the real shape of a tensor it stored reshaped.
constexpr const char* kOrigShape = "comfy.gguf.orig_shape.";

}  // namespace

GgufWeights::GgufWeights(const std::string& path) : file_(std::make_shared<io::GgufFile>(path)) {
  // city96's converter (ComfyUI-GGUF tools/convert.py, "shape fix", used for SD1.x / SDXL UNets) stores a
  // tensor whose innermost dimension is no whole number of 256-blocks but whose values are, as
  // [numel / 256, 256], so that K-quants apply to convolutions and narrow Linear weights, and records the
  // real shape (torch order) under comfy.gguf.orig_shape.<name>. Read back, the tensor has its real shape.
  for (const auto& [key, value] : file_->metadata()) {
    if (key.rfind(kOrigShape, 0) != 0) continue;
    const std::string name = key.substr(std::string(kOrigShape).size());
    const auto* dims = std::get_if<std::vector<int64_t>>(&value);
    KILN_CHECK(dims != nullptr && !dims->empty() && file_->contains(name),
               path << ": metadata " << key << " should be the integer shape of a tensor of the file");
    int64_t numel = 1;
    for (const int64_t d : *dims) {
      KILN_CHECK(d > 0 && numel <= (int64_t{1} << 40) / d, path << ": metadata " << key << " is no shape");
      numel *= d;
    }
    KILN_CHECK(numel == shape_numel(file_->info(name).shape),
               path << ": " << key << " gives " << shape_str(Shape(dims->begin(), dims->end())) << " for '"
                    << name << "', which holds " << shape_str(file_->info(name).shape) << " values");
    original_shapes_[name] = Shape(dims->begin(), dims->end());
  }
}

bool GgufWeights::contains(const std::string& name) const {
  return file_->contains(name);
}
Shape GgufWeights::shape(const std::string& name) const {
  auto it = original_shapes_.find(name);
  return it != original_shapes_.end() ? it->second : file_->info(name).shape;
}
Tensor GgufWeights::load(const std::string& name) const {
  auto it = original_shapes_.find(name);
  if (it == original_shapes_.end()) return file_->tensor(name);
  return file_->tensor(name).contiguous().reshape(it->second);
}
std::vector<std::string> GgufWeights::names() const {
  return file_->names();
}
std::string GgufWeights::description() const {
  return file_->path();
}
quant::QuantizedTensor GgufWeights::load_quantized(const std::string& name) const {
  const io::GgufTensorInfo& info = file_->info(name);
  const quant::StorageTypeTraits& traits = quant::traits(info.type);
  if (!traits.is_quantized) return {};
  quant::QuantizedTensor q = file_->blocks(name);
  auto it = original_shapes_.find(name);
  if (it == original_shapes_.end()) return q;
  // A reshaped tensor's blocks run through its values in order, so when the real rows are whole blocks they
  // are the real rows' blocks (Q8_0 and the other 32-blocks on rows of 320, 640, ...); otherwise the layer
  // gets plain values (load()).
  const int64_t row = it->second.back();
  if (row % traits.block_size != 0) return {};
  const int64_t row_bytes = row / traits.block_size * traits.type_size;
  q.blocks = q.blocks.reshape({q.blocks.numel() / row_bytes, row_bytes});
  q.shape = it->second;
  return q;
}

}  // namespace kiln::nn
