// What every Kiln pipeline (FluxPipeline, StableDiffusion3Pipeline, Flux2Pipeline, Flux2KleinPipeline)
// shares, as diffusers' DiffusionPipeline does: the load options, the output, where the model came from, its
// dtype, how its weights are held, the offload API and VAE tiling. Each pipeline names its components (in the
// order they run) and its VAE; the rest is here.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/dist/device_mesh.h"
#include "kiln/nn/module.h"
#include "kiln/pipelines/image.h"
#include "kiln/pipelines/offload.h"
#include "kiln/pipelines/weight_packing.h"

namespace kiln {

namespace models {
class AutoencoderKL;
}  // namespace models

struct PipelineLoadOptions {
  DType dtype = float32;  // every component is run in this dtype (weights converted when stored otherwise)
  std::string revision;   // for repo ids: branch, tag or commit in the local Hugging Face cache
  // The transformer from this single file in the original layout (Black Forest Labs' for FLUX, Stability
  // AI's for SD3), .safetensors or .gguf (FluxTransformer2DModel / SD3Transformer2DModel::from_single_file),
  // instead of the model's transformer/ folder, whose config.json describes it (required for SD3).
  // GGUF-quantized Linear weights stay quantized.
  std::string transformer_file;
  // Called as each component finishes loading: (component name, index, count).
  std::function<void(const std::string&, int, int)> on_component_loaded;
  // The most bytes of packed weight copies (kiln/pipelines/weight_packing.h; kAllWeightsPacked: no limit).
  // Absent: all weights packed when they fit in half of this machine's memory, none otherwise (they are then
  // read from the memory-mapped checkpoint, as diffusers does). Applied process-wide when loading ends.
  std::optional<int64_t> packed_weight_budget;
  // Tensor parallelism per component, by the pipeline's component names ("transformer", and the large text
  // encoder: T5, "text_encoder_2" in FLUX, "text_encoder_3" in SD3; Mistral 3 / Qwen3, "text_encoder" in
  // FLUX.2), as diffusers' parallel_config: each rank builds the
  // component's shard and reads only its slices. CLIP and the VAE stay replicated (an error names them):
  // they are small, and CLIP's pooled output and the VAE's convolutions have no column/row split that
  // pays for its collectives.
  std::map<std::string, dist::TensorParallelConfig> parallel_config;
  // The layer view of parallel_config[component] (no parallelism when absent); throws naming a component
  // that cannot be split or is not in `splittable`.
  nn::TensorParallel tensor_parallel_for(const std::string& component,
                                         const std::vector<std::string>& splittable) const;
};

struct PipelineOutput {
  std::vector<Image> images;
};

class DiffusionPipeline {
 public:
  virtual ~DiffusionPipeline();

  DType dtype() const { return dtype_; }
  const std::string& model_path() const { return path_; }
  // How the weights are held (applied when loading ended).
  const WeightPackingPlan& weight_packing() const { return weight_packing_; }
  // The components that hold weights, in the order a call runs them (absent ones are null).
  virtual std::vector<std::pair<std::string, nn::Module*>> components() const = 0;

  // diffusers' enable_model_cpu_offload: each component holds its weights only while it runs. On a host
  // without an accelerator the weights live in the memory-mapped checkpoint; once a component has run, its
  // packed copies are freed and its file pages handed back (page cache included), so the memory goes to the
  // component that runs next (Module::release_weights). The image does not change; later calls read the
  // weights from the file again. KILN_LOG=offload says what was released and when. `device` is where each
  // component computes while it runs; detected when not given (default_compute_device()), an error naming it
  // when this build has no backend for it.
  void enable_model_cpu_offload(std::optional<Device> device = std::nullopt);
  bool model_cpu_offload_enabled() const { return model_cpu_offload_; }
  // diffusers' enable_sequential_cpu_offload (kiln/pipelines/offload.h): no packed copies, at most
  // `resident_bytes` of the mapped weights kept in memory (0: each weight released once the next one is
  // read), and model offload between components.
  void enable_sequential_cpu_offload(int64_t resident_bytes = 0);
  // diffusers' enable_group_offload (block level): weights read in place from the mapped checkpoint; each
  // component's repeated blocks in groups of `blocks_per_group`, a group's pages handed back once the next
  // group runs and, with `prefetch`, the group after it brought in on a background thread while the current
  // one computes (kiln/runtime/weight_groups.h); model offload between components. Every execution mode.
  void enable_group_offload(const GroupOffloadOptions& options = {});
  // Applies the coarsest offload that keeps the weights under `bytes` (plan_offload); throws before any work
  // when even the largest weight does not fit. Activations come on top.
  OffloadPlan set_memory_budget(int64_t bytes);
  // diffusers' pipe.to(device): every component resident on `device`, any offloading turned off (the weights
  // packed as weight_packing() says). This build runs on the CPU only; another device is an error naming it.
  void to(const Device& device);

  // diffusers' enable_vae_tiling / disable_vae_tiling: the VAE decodes latents larger than a tile in
  // overlapping, blended tiles. `tile_size` in pixels; 0 keeps the VAE's sample_size (1024 for FLUX.1, FLUX.2
  // and SD3, so only larger images tile unless a smaller size is given).
  void enable_vae_tiling(int64_t tile_size = 0);
  void disable_vae_tiling();

 protected:
  DiffusionPipeline();
  DiffusionPipeline(DiffusionPipeline&&) noexcept;
  DiffusionPipeline& operator=(DiffusionPipeline&&) noexcept;

  virtual models::AutoencoderKL& vae_model() const = 0;
  // Under model offload, releases the weights of the (name, module) components that just ran.
  void release_after_use(std::initializer_list<std::pair<const char*, nn::Module*>> ran) const;
  // Sets the packed-weight plan from the components' weights in the pipeline's dtype (at the end of loading).
  void plan_weight_packing(const std::optional<int64_t>& requested_budget);

  std::string path_;
  std::string name_;  // what the user asked for (repo id or folder), recorded in image metadata
  DType dtype_ = float32;
  WeightPackingPlan weight_packing_;
  bool model_cpu_offload_ = false;
};

}  // namespace kiln
