#include "kiln/nn/checkpoint_weights.h"

#include <filesystem>

#include "kiln/io/checkpoint.h"
#include "kiln/ops/layout.h"

namespace kiln::nn {

struct CheckpointWeights::Impl {
  io::Checkpoint checkpoint;
};

CheckpointWeights::CheckpointWeights(const std::string& path)
    : impl_(std::make_unique<Impl>(
          Impl{io::Checkpoint(std::filesystem::is_directory(path) ? io::find_checkpoint(path) : path)})) {}
CheckpointWeights::~CheckpointWeights() = default;

bool CheckpointWeights::contains(const std::string& name) const {
  return impl_->checkpoint.contains(name);
}
Shape CheckpointWeights::shape(const std::string& name) const {
  return impl_->checkpoint.info(name).shape;
}
Tensor CheckpointWeights::load(const std::string& name) const {
  return impl_->checkpoint.tensor(name);
}
Tensor CheckpointWeights::load_slices(const std::string& name, int dim,
                                      const std::vector<std::pair<int64_t, int64_t>>& ranges) const {
  const io::Checkpoint& c = impl_->checkpoint;
  const int64_t rank = static_cast<int64_t>(c.info(name).shape.size());
  KILN_CHECK(dim == 0 || dim == rank - 1,
             c.path() << ": tensor '" << name << "': slices along dimension " << dim << " of a " << rank
                      << "-D tensor; only the first or last dimension can be read "
                         "in slices");
  std::vector<Tensor> pieces;
  for (const auto& [start, end] : ranges) {
    if (dim == 0) {
      pieces.push_back(c.rows(name, start, end));
      continue;
    }
    const Tensor view = c.columns(name, start, end);
    pieces.push_back(view.contiguous());
    // Copying columns reads every row's pages; the copy is what the rank keeps, so the file pages go back.
    if (view.storage() != pieces.back().storage()) view.storage()->drop_resident_pages();
  }
  return pieces.size() == 1 ? pieces.front() : concat(pieces, dim);
}

std::vector<std::string> CheckpointWeights::names() const {
  return impl_->checkpoint.names();
}
std::string CheckpointWeights::description() const {
  return impl_->checkpoint.path();
}
quant::QuantizedTensor CheckpointWeights::load_quantized(const std::string& name) const {
  const io::TensorInfo& info = impl_->checkpoint.info(name);
  const auto type = quant::kept_safetensors_type(info.stored_dtype, info.shape.size());
  if (!type) return {};
  return {impl_->checkpoint.stored_bytes(name), *type, info.shape};
}

DType CheckpointWeights::stored_dtype(const std::string& name) const {
  return impl_->checkpoint.info(name).dtype;
}

}  // namespace kiln::nn
