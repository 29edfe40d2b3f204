#include "kiln/pipelines/diffusion_pipeline.h"

#include <algorithm>

#include "kiln/core/device_runtime.h"
#include "kiln/core/log.h"
#include "kiln/models/autoencoder_kl.h"
#include "pipelines/model_offload.h"

namespace kiln {

DiffusionPipeline::DiffusionPipeline() = default;
DiffusionPipeline::DiffusionPipeline(DiffusionPipeline&&) noexcept = default;
DiffusionPipeline& DiffusionPipeline::operator=(DiffusionPipeline&&) noexcept = default;
DiffusionPipeline::~DiffusionPipeline() = default;

void DiffusionPipeline::enable_sequential_cpu_offload(int64_t resident_bytes) {
  model_cpu_offload_ = pipelines::apply_offload(
      {.mode = OffloadMode::Sequential, .budget = std::max<int64_t>(resident_bytes, 0)}, components());
}

void DiffusionPipeline::enable_group_offload(const GroupOffloadOptions& options) {
  model_cpu_offload_ = pipelines::apply_offload({.mode = OffloadMode::Group, .group = options}, components());
}

void DiffusionPipeline::enable_model_cpu_offload(std::optional<Device> device) {
  const Device on = pipelines::offload_compute_device(device);
  pipelines::clear_offload(weight_packing_);
  model_cpu_offload_ = true;
  if (log_enabled("offload"))
    log("offload", "model offload: each component on " + on.str() + " while it runs");
}

void DiffusionPipeline::to(const Device& device) {
  device_runtime(device);  // throws, naming the device, when this build has no backend for it
  pipelines::clear_offload(weight_packing_);
  model_cpu_offload_ = false;
  if (log_enabled("offload")) log("offload", "every component resident on " + device.str());
}

OffloadPlan DiffusionPipeline::set_memory_budget(int64_t bytes) {
  const OffloadPlan plan = plan_offload(components(), bytes);
  model_cpu_offload_ = pipelines::apply_offload(plan, components());
  return plan;
}

void DiffusionPipeline::enable_vae_tiling(int64_t tile_size) {
  vae_model().enable_tiling({.tile_sample_min_size = tile_size});
}

void DiffusionPipeline::disable_vae_tiling() {
  vae_model().disable_tiling();
}

void DiffusionPipeline::release_after_use(
    std::initializer_list<std::pair<const char*, nn::Module*>> ran) const {
  if (model_cpu_offload_) pipelines::release_after_use(ran);
}

void DiffusionPipeline::plan_weight_packing(const std::optional<int64_t>& requested_budget) {
  size_t bytes = 0;
  for (const auto& [name, module] : components())
    if (module != nullptr) bytes += module->parameter_bytes(dtype_);
  weight_packing_ = apply_weight_packing(static_cast<int64_t>(bytes), requested_budget);
}

}  // namespace kiln
