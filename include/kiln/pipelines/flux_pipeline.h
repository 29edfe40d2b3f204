// FluxPipeline: FLUX.1-schnell / FLUX.1-dev text-to-image, as diffusers' FluxPipeline, from a diffusers
// folder or a Hugging Face repo id in the local cache:
//
//   auto pipe = kiln::FluxPipeline::from_pretrained("black-forest-labs/FLUX.1-schnell", {.dtype =
//   kiln::bfloat16}); auto result = pipe({.prompt = "a golden retriever surfing a wave", .height = 1024,
//   .width = 1024,
//                       .num_inference_steps = 4, .guidance_scale = 0.0f, .generator = kiln::Generator(0)});
//   result.images[0].save("output.png");
//
// The same seed gives diffusers' initial noise, and every stage follows diffusers' dtype path, so Kiln's
// image matches diffusers' for the same inputs.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/dist/device_mesh.h"
#include "kiln/pipelines/generator.h"
#include "kiln/pipelines/image.h"
#include "kiln/pipelines/offload.h"
#include "kiln/pipelines/weight_packing.h"

namespace kiln {

namespace models {
class ClipTextModel;
class T5EncoderModel;
class FluxTransformer2DModel;
class AutoencoderKL;
}  // namespace models
namespace tokenizers {
class ClipTokenizer;
class T5Tokenizer;
}  // namespace tokenizers
class FlowMatchEulerDiscreteScheduler;

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
  // Tensor parallelism per component, by the pipeline's component names ("transformer", and the T5 encoder:
  // "text_encoder_2" in FLUX, "text_encoder_3" in SD3), as diffusers' parallel_config: each rank builds the
  // component's shard and reads only its slices. CLIP and the VAE stay replicated (an error names them):
  // they are small, and CLIP's pooled output and the VAE's convolutions have no column/row split that
  // pays for its collectives.
  std::map<std::string, dist::TensorParallelConfig> parallel_config;
  // The layer view of parallel_config[component] (no parallelism when absent); throws naming a component
  // that cannot be split or is not in `splittable`.
  nn::TensorParallel tensor_parallel_for(const std::string& component,
                                         const std::vector<std::string>& splittable) const;
};

struct FluxPipelineCall {
  std::string prompt;
  std::optional<std::string> prompt_2;  // the T5 prompt; the CLIP prompt is used when absent (as diffusers)
  int64_t height = 1024;
  int64_t width = 1024;
  int num_inference_steps = 28;
  float guidance_scale = 3.5f;         // ignored by models without guidance embeddings (schnell)
  std::optional<Generator> generator;  // torch's default seed when absent
  int64_t max_sequence_length = 512;
  int num_images_per_prompt = 1;
  // Called after each denoising step with (step index from 0, total steps, seconds the step took).
  std::function<void(int, int, double)> on_step_end;
};

struct PipelineOutput {
  std::vector<Image> images;
};

class FluxPipeline {
 public:
  // `model` is a diffusers folder or a repo id ("black-forest-labs/FLUX.1-dev") in the local HF cache.
  static FluxPipeline from_pretrained(const std::string& model, const PipelineLoadOptions& options = {});
  FluxPipeline(FluxPipeline&&) noexcept;
  FluxPipeline& operator=(FluxPipeline&&) noexcept;
  ~FluxPipeline();

  PipelineOutput operator()(const FluxPipelineCall& call);

  // ---- the stages, as diffusers names them (public so each can be checked against diffusers)
  struct PromptEmbeddings {
    Tensor prompt_embeds;                   // [B, L, joint_attention_dim] (T5)
    Tensor pooled_prompt_embeds;            // [B, pooled_projection_dim] (CLIP)
    Tensor text_ids;                        // [L, 3]
    std::vector<int64_t> clip_ids, t5_ids;  // the token ids of the (first) prompt
  };
  PromptEmbeddings encode_prompt(const std::string& prompt, const std::optional<std::string>& prompt_2,
                                 int num_images_per_prompt, int64_t max_sequence_length) const;
  // Packed noise [B, N, in_channels] and its image ids [N, 3], drawn as diffusers' prepare_latents does.
  std::pair<Tensor, Tensor> prepare_latents(int64_t batch, int64_t height, int64_t width, DType dtype,
                                            Generator& generator) const;
  // Packed latents -> float image [B, H, W, 3] in [0, 1] (diffusers' output_type="np").
  Tensor decode_latents(const Tensor& latents, int64_t height, int64_t width) const;

  const models::FluxTransformer2DModel& transformer() const { return *transformer_; }
  // For compiled mode: pipe.transformer().compile({...}) or .compile_repeated_blocks().
  models::FluxTransformer2DModel& transformer() { return *transformer_; }
  // diffusers' enable_vae_tiling / disable_vae_tiling: the VAE decodes latents larger than a tile in
  // overlapping, blended tiles. `tile_size` in pixels; 0 keeps the VAE's sample_size (1024 for FLUX.1 and
  // SD3, so only larger images tile unless a smaller size is given).
  void enable_vae_tiling(int64_t tile_size = 0);
  void disable_vae_tiling();
  DType dtype() const { return dtype_; }
  const std::string& model_path() const { return path_; }
  // How the weights are held (applied when loading ended).
  const WeightPackingPlan& weight_packing() const { return weight_packing_; }
  // diffusers' enable_model_cpu_offload: each component holds its weights only while it runs. On a host
  // without an accelerator the weights live in the memory-mapped checkpoint; once a component has run, its
  // packed copies are freed and its file pages handed back (page cache included), so the memory goes to the
  // component that runs next (Module::release_weights). The image does not change; later calls read the
  // weights from the file again. KILN_LOG=offload says what was released and when.
  // `device` is where each component computes while it runs; detected when not given
  // (default_compute_device()), an error naming it when this build has no backend for it.
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

 private:
  FluxPipeline();
  std::vector<std::pair<std::string, nn::Module*>> components() const;
  void check_call(const FluxPipelineCall& call) const;

  std::string path_;
  std::string name_;  // what the user asked for (repo id or folder), recorded in image metadata
  DType dtype_ = float32;
  WeightPackingPlan weight_packing_;
  bool model_cpu_offload_ = false;
  std::unique_ptr<tokenizers::ClipTokenizer> tokenizer_;
  std::unique_ptr<tokenizers::T5Tokenizer> tokenizer_2_;
  std::unique_ptr<models::ClipTextModel> text_encoder_;
  std::unique_ptr<models::T5EncoderModel> text_encoder_2_;
  std::unique_ptr<models::FluxTransformer2DModel> transformer_;
  std::unique_ptr<models::AutoencoderKL> vae_;
  std::unique_ptr<FlowMatchEulerDiscreteScheduler> scheduler_;
};

}  // namespace kiln
