// PipelineLoadOptions::tensor_parallel_for: which components of a pipeline take a TensorParallelConfig.
#include "kiln/core/error.h"
#include "kiln/pipelines/diffusion_pipeline.h"

namespace kiln {

nn::TensorParallel PipelineLoadOptions::tensor_parallel_for(
    const std::string& component, const std::vector<std::string>& splittable) const {
  for (const auto& [name, config] : parallel_config) {
    bool known = false;
    for (const std::string& s : splittable) known = known || s == name;
    std::string names;
    for (const std::string& s : splittable) names += (names.empty() ? "" : ", ") + s;
    KILN_CHECK(known, "parallel_config: component '"
                          << name << "' cannot be split over ranks (CLIP and the VAE stay replicated); this "
                          << "pipeline splits "
                          << (names.empty() ? std::string("none of its components") : names));
  }
  KILN_CHECK(tensor_parallel >= 1, "tensor_parallel must be at least 1, got " << tensor_parallel);
  auto it = parallel_config.find(component);
  if (it != parallel_config.end()) return it->second.layers();
  if (tensor_parallel == 1) return {};
  for (const std::string& s : splittable)
    if (s == component)
      return dist::TensorParallelConfig{.mesh = dist::DeviceMesh("cpu", {tensor_parallel})}.layers();
  return {};
}

}  // namespace kiln
