#include "kiln/nn/checkpoint_weights.h"

#include <filesystem>

#include "kiln/io/checkpoint.h"

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
std::vector<std::string> CheckpointWeights::names() const {
  return impl_->checkpoint.names();
}
std::string CheckpointWeights::description() const {
  return impl_->checkpoint.path();
}
DType CheckpointWeights::stored_dtype(const std::string& name) const {
  return impl_->checkpoint.info(name).dtype;
}

}  // namespace kiln::nn
