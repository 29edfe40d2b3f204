// What every Kiln pipeline (FluxPipeline, StableDiffusion3Pipeline, Flux2Pipeline, Flux2KleinPipeline)
// shares, as diffusers' DiffusionPipeline does: loading by class name from model_index.json, the load
// options, one request type and one call, the execution context the pipeline runs in, the offload API, the
// execution modes and VAE tiling. Each pipeline names its components (in the order they run), its VAE and its
// transformer, checks the requests it takes and runs them; the rest is here.
//
//   auto pipe = kiln::DiffusionPipeline::from_pretrained("black-forest-labs/FLUX.1-schnell",
//                                                        {.dtype = kiln::bfloat16});
//   pipe->configure({.mode = kiln::ExecutionMode::Compile});
//   auto result = (*pipe)({.prompt = "a cat", .num_inference_steps = 4, .generator = kiln::Generator(0)});
//
// Calls are reentrant: one loaded pipeline may be called from several threads. Each call owns its state
// (schedule, generator, buffers); calls to one pipeline are served one at a time, in arrival order (its
// context's stream, deferred graph and offloaded weights are the pipeline's), and each gives exactly the
// image it gives alone. Pipelines with contexts of their own run side by side.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/allocator.h"
#include "kiln/dist/device_mesh.h"
#include "kiln/lora/lora_adapters.h"
#include "kiln/nn/module.h"
#include "kiln/nn/step_cache.h"
#include "kiln/pipelines/activation_estimate.h"
#include "kiln/pipelines/image.h"
#include "kiln/pipelines/offload.h"
#include "kiln/pipelines/pipeline_request.h"
#include "kiln/pipelines/weight_packing.h"
#include "kiln/runtime/execution_context.h"

namespace kiln {

namespace models {
class LatentCodec;
}  // namespace models
struct PipelineClass;
namespace pipelines {
class CallQueue;
struct SharedPipelineState;
class CallControl;
struct TaskCall;
struct TaskStart;
}  // namespace pipelines

struct PipelineLoadOptions {
  DType dtype = float32;  // every component is run in this dtype (weights converted when stored otherwise)
  std::string revision;   // for repo ids: branch, tag or commit in the local Hugging Face cache
  // The transformer from this single file in the original layout (Black Forest Labs' for FLUX, Stability
  // AI's for SD3), .safetensors or .gguf (FluxTransformer2DModel / SD3Transformer2DModel::from_single_file),
  // instead of the model's transformer/ folder, whose config.json describes it (required for SD3).
  // GGUF-quantized Linear weights stay quantized.
  std::string transformer_file;
  // The whole pipeline's weights from this one file in its original layout (an SD1.x or SDXL finetune: the
  // UNet, text encoders and VAE), as diffusers' from_single_file(file, config=model): the model folder gives
  // the configs, tokenizers and scheduler, and the components the file lacks. from_pretrained sets it when
  // given such a file as the model.
  std::string single_file;
  // With a single file given as the model: the folder or repo id whose configs it takes (default: the
  // family's base model, e.g. stabilityai/stable-diffusion-xl-base-1.0, from the local Hugging Face cache).
  std::string single_file_config;
  // Called as each component finishes loading: (component name, index, count).
  std::function<void(const std::string&, int, int)> on_component_loaded;
  // The most bytes of packed weight copies (kiln/pipelines/weight_packing.h; kAllWeightsPacked: no limit).
  // Absent: all weights packed when they fit in half of this machine's memory, none otherwise (they are then
  // read from the memory-mapped checkpoint, as diffusers does). Applied to the pipeline's context.
  std::optional<int64_t> packed_weight_budget;
  // Tensor parallelism per component, by the pipeline's component names ("transformer", and the large text
  // encoder: T5, "text_encoder_2" in FLUX, "text_encoder_3" in SD3; Mistral 3 / Qwen3, "text_encoder" in
  // FLUX.2), as diffusers' parallel_config: each rank builds the component's shard and reads only its slices.
  // CLIP and the VAE stay replicated (an error names them): they are small, and CLIP's pooled output and the
  // VAE's convolutions have no column/row split that pays for its collectives.
  std::map<std::string, dist::TensorParallelConfig> parallel_config;
  // Shorthand: every component the pipeline can split (splittable_components()) over this many ranks of the
  // process group, on a one-dimensional CPU mesh; parallel_config entries win.
  int tensor_parallel = 1;
  // The execution context the pipeline runs in (kiln/runtime/execution_context.h); a new one of its own when
  // null. Pipelines that share one share its mode, budgets and stream.
  std::shared_ptr<ExecutionContext> context;
  // The layer view of the tensor parallelism of `component` (none when absent); throws naming a component
  // that cannot be split or is not in `splittable`.
  nn::TensorParallel tensor_parallel_for(const std::string& component,
                                         const std::vector<std::string>& splittable) const;
};

// One of these, by the request's output_type.
struct PipelineOutput {
  std::vector<Image> images;  // OutputType::Image: 8-bit RGB, with the parameters in their metadata
  Tensor array;               // OutputType::Array: float32 [B, H, W, 3] in [0, 1] (diffusers' "np")
  Tensor latents;             // OutputType::Latent: as the denoising loop ends (FLUX: packed [B, N, C])
  // The request's generator (or generators) after the call's draws: a caller's generator continues from
  // here, as a torch.Generator passed to diffusers would. Unset when the request gave none.
  std::optional<Generator> generator;
  std::vector<Generator> generators;
};

// How a pipeline's ops run (kiln/runtime/eager_mode.h, kiln/nn/compile.h).
enum class ExecutionMode {
  Eager,          // strict eager, asynchronous dispatch
  Fuse,           // deferred and fused
  Compile,        // the transformer compiled per input shape
  CompileBlocks,  // the transformer's repeated blocks compiled once each
};
const char* execution_mode_name(ExecutionMode mode);  // "eager", "fuse", "compile", "compile-blocks"
// From its name; throws kiln::Error naming the accepted ones.
ExecutionMode parse_execution_mode(const std::string& name);

// DiffusionPipeline::configure's settings, as `kiln generate` takes them.
struct ExecutionOptions {
  // Unset: strict eager unless the environment says otherwise (KILN_DEFER_AND_FUSE, KILN_LAUNCH_BLOCKING).
  std::optional<ExecutionMode> mode;
  // Unset: model offload when the weights exceed half of this machine's memory (nothing packed), else none.
  // On a device whose plugin reports its memory (CUDA, TPU): a memory budget of what the device has free
  // for Kiln (its size less what others use there), as max_memory would plan it.
  std::optional<OffloadMode> offload;
  int blocks_per_group = 1;  // group offload's blocks per group
  // The most memory the weights may hold: picks the offload itself (set_memory_budget); not with `offload`.
  // On a device, the most memory Kiln may hold there (weights and activations).
  std::optional<int64_t> max_memory;
  // Where the components compute (kiln generate --device): a PJRT device gets the offload onto it (its
  // weights kept on the host), or every component moved there (pipe.to) without one. Absent: the cpu.
  std::optional<Device> device;
  // The call a memory budget on a device is planned for first (its activations' estimate); absent: the
  // pipeline's default size. Each call plans again for its own.
  std::optional<PipelineRequest> sized_for;
};

class DiffusionPipeline {
 public:
  virtual ~DiffusionPipeline();

  // diffusers' DiffusionPipeline.from_pretrained: the pipeline class named by model_index.json's _class_name
  // (pipeline_class_names()), loaded from a diffusers folder or a repo id in the local Hugging Face cache.
  // Throws kiln::Error naming the class and the ones Kiln runs when it is not one of them.
  static std::unique_ptr<DiffusionPipeline> from_pretrained(const std::string& model,
                                                            const PipelineLoadOptions& options = {});

  // "FluxPipeline", as model_index.json names it.
  virtual const char* class_name() const = 0;
  // The values a request's unset fields take: the family's (diffusers' defaults for the class), with the
  // model folder's recommended call over them where it has one (recommended_call()).
  PipelineDefaults defaults() const;
  // diffusers' defaults for the class (its __call__'s).
  virtual PipelineDefaults family_defaults() const = 0;
  // What the model folder recommends for a call (recommended_call.json beside model_index.json), when it
  // holds one: a small model trained at 64 x 64 says so, rather than every caller starting from the family's
  // 1024.
  const std::optional<RecommendedCall>& recommended_call() const { return recommended_call_; }
  // "the family's defaults (FluxPipeline)" or "<folder>/recommended_call.json", for the callers to say which.
  std::string defaults_source() const;

  // Generates images: checks the request (RequestError naming the field at fault), waits for its turn (see
  // above; under tensor parallelism every rank runs calls in rank 0's order: kiln/dist/call_sequencer.h), and
  // runs it in the pipeline's execution context. Throws Cancelled when request.cancel is cancelled before the
  // call ends.
  PipelineOutput operator()(const PipelineRequest& request);
  // The checks operator() makes before it waits or loads anything: a field this pipeline does not take or a
  // value out of range throws RequestError naming the field.
  void check_request(const PipelineRequest& request) const;

  DType dtype() const { return dtype_; }
  const std::string& model_path() const { return path_; }
  ExecutionContext& context() const { return *context_; }
  // How the weights are held (applied when loading ended).
  const WeightPackingPlan& weight_packing() const { return weight_packing_; }
  // The components that hold weights, in the order a call runs them (absent ones are null).
  virtual std::vector<std::pair<std::string, nn::Module*>> components() const = 0;
  // What `request`'s activations would hold at once on `device`, estimated from its shapes
  // (kiln/pipelines/activation_estimate.h): what a memory budget on a device keeps free beside the weights.
  virtual ActivationEstimate estimate_activations(const PipelineRequest& request,
                                                  const Device& device) const = 0;
  // The denoiser (a transformer, or a UNet), which the compiled modes compile.
  virtual nn::Module& denoiser() = 0;
  // The class as the registry declares it (kiln/pipelines/pipeline_registry.h): its family, task and fields.
  const PipelineClass& registered_class() const;

  // Applies the execution mode and the offload (as `kiln generate --mode/--offload/--max-memory` do) and
  // returns what was chosen, one line per setting that needs saying ("model offload: ...").
  std::vector<std::string> configure(const ExecutionOptions& options);

  // diffusers' enable_model_cpu_offload: each component holds its weights only while it runs. On a host
  // without an accelerator the weights live in the memory-mapped checkpoint; once a component has run, its
  // packed copies are freed and its file pages handed back (page cache included), so the memory goes to the
  // component that runs next (Module::release_weights). The image does not change; later calls read the
  // weights from the file again. KILN_LOG=offload says what was released and when. `device` is where each
  // component computes while it runs; when not given, the device pipe.to put the transformer on, else
  // default_compute_device(); an error naming it when this build has no backend for it. On a device with
  // memory of its own (xla-cpu, cuda, tpu: diffusers' enable_model_cpu_offload(device="cuda")) the weights
  // stay on the host (a component already there is copied back) and each component's are copied into the
  // device's memory as it runs and freed there once it has run: the image is the one pipe.to(device) gives.
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
  // With options.onload_device a device with memory of its own: the groups are copied into its memory and
  // freed there instead, the next one copied while the current one computes.
  void enable_group_offload(const GroupOffloadOptions& options = {});
  // Applies the coarsest offload that keeps the weights under `bytes` (plan_offload); throws before any work
  // when even the largest weight does not fit. Activations come on top. On a device with memory of its own
  // (`device`, or the one pipe.to put the transformer on) `bytes` holds the activations too: the weights get
  // what the activations' estimate (estimate_activations) leaves, for `sized_for` here (without it, the
  // pipeline's defaults when they fit, else the weights alone) and for each call's own request when it runs
  // (a call that needs another plan gets it first); it picks none, model or group offload onto it, refuses
  // (naming the sizes and the estimate) a budget below group offload's one-block groups plus the activations,
  // and limits what Kiln holds there to `bytes` (set_memory_limit) until pipe.to or another offload call
  // lifts it: past it a call fails naming the device.
  OffloadPlan set_memory_budget(int64_t bytes, std::optional<Device> device = std::nullopt,
                                const std::optional<PipelineRequest>& sized_for = std::nullopt);
  // Under a memory budget on a device: the plan in effect (the last call's, else the default size's).
  std::optional<OffloadPlan> device_memory_plan() const;
  // The plan set_memory_budget(bytes, device) would apply for `request` on the PJRT device `device`, without
  // applying it (`kiln info --max-memory --device`); throws its refusal, naming the sizes and the estimate.
  OffloadPlan plan_device_budget(int64_t bytes, const Device& device, const PipelineRequest& request) const;
  // diffusers' pipe.to(device): every component resident on `device`, any offloading turned off (on the cpu
  // the weights packed as weight_packing() says). On a PJRT device (xla-cpu, cuda, tpu) the weights are
  // copied there and every component runs there, in the execution mode configure() sets; the noise is still
  // drawn by torch's CPU generator on the host, so a seed gives the same image on every device, and images
  // come back to the host. Turns any offloading off (and the memory limit set_memory_budget set there).
  // Throws, before anything moves, naming the device when no backend or plugin drives it, or naming the
  // parameter when a weight cannot go there (kept block-quantized: GGUF).
  void to(const Device& device);
  // diffusers' pipe.vae.to(device), pipe.transformer.to(device), ...: one component (components()' name)
  // moved; each stage moves its inputs to its component's device, so components may sit on different
  // devices. Throws naming the component when the pipeline has none of that name.
  void component_to(const std::string& component, const Device& device);
  // Where the transformer's weights are (diffusers' pipe.device).
  Device device();

  // diffusers' enable_vae_tiling / disable_vae_tiling: the VAE decodes latents larger than a tile in
  // overlapping, blended tiles. `tile_size` in pixels; 0 keeps the VAE's sample_size (1024 for FLUX.1, FLUX.2
  // and SD3, so only larger images tile unless a smaller size is given).
  void enable_vae_tiling(int64_t tile_size = 0);
  void disable_vae_tiling();

  // ---- LoRA adapters, as diffusers' LoraLoaderMixin (kiln/lora/lora_adapters.h says what each does; the
  // layouts read: kiln/lora/lora_keys.h). An unfused adapter runs beside the base weights (memory-mapped,
  // bfloat16 or GGUF blocks alike), in every execution mode and under tensor parallelism; a compiled program
  // takes its weights as inputs, so set_adapters never recompiles unless the active adapters' total rank on
  // a layer changes. Each of these waits for the calls that arrived before it, like a call.
  //   pipe.load_lora_weights("style.safetensors", {.adapter_name = "style"});
  //   pipe.load_lora_weights("detail.safetensors", {.adapter_name = "detail"});
  //   pipe.set_adapters({"style", "detail"}, {0.8, 0.5});
  lora::LoraLoadReport load_lora_weights(const std::string& path, const lora::LoraLoadOptions& options = {});
  void set_adapters(const std::vector<std::string>& adapter_names,
                    const std::vector<double>& adapter_weights = {});
  void fuse_lora(const lora::FuseLoraOptions& options = {});
  void unfuse_lora();
  void unload_lora_weights();
  void delete_adapters(const std::vector<std::string>& adapter_names);
  std::vector<std::string> get_active_adapters() const;
  std::map<std::string, std::vector<std::string>> get_list_adapters() const;

 protected:
  DiffusionPipeline();
  DiffusionPipeline(DiffusionPipeline&&) noexcept;
  DiffusionPipeline& operator=(DiffusionPipeline&&) noexcept;
  // What the families' from_pipe (diffusers') builds on: a pipeline that shares `other`'s components, the
  // queue its calls wait in and its LoRA adapters, its settings (dtype, offload, a memory budget's plan)
  // copied as they are now.
  struct SharingComponents {};
  DiffusionPipeline(const DiffusionPipeline& other, SharingComponents);

  // Runs a checked request, in the pipeline's context, with the call's turn held; `control` tells it when to
  // stop (CallControl::checkpoint between stages; the denoising loop checks before every step).
  virtual PipelineOutput run(const PipelineRequest& request, const pipelines::CallControl& control) = 0;
  // The request checks that need the loaded pipeline (sizes against its VAE and transformer, ...), after the
  // field checks of its class (PipelineClass::check_fields).
  virtual void check_loaded_request(const PipelineRequest& request) const = 0;
  // Whether the call's classifier-free guidance evaluates the negative prompt in transformer calls of its own
  // (the step cache's "uncond" context): true CFG (diffusers' do_true_cfg: a negative prompt and a
  // true_cfg_scale above 1, its default the family's), FLUX.2 klein's guidance_scale above 1; false for the
  // families that have none.
  virtual bool negative_evaluations(const PipelineRequest&) const { return false; }
  // The VAE, as the latents' codec (kiln/models/latent_codec.h).
  virtual models::LatentCodec& latent_codec() const = 0;
  // What LoRA means for this pipeline: its family's descriptor (`registered`), which a class may refine from
  // its loaded configs (the UNet pipelines: kohya's SGM block numbers follow the UNet's layers_per_block).
  virtual lora::LoraFamily lora_family(const lora::LoraFamily& registered) const { return registered; }

  // Sets the pipeline's execution context: options.context, else a new one named after the pipeline and the
  // model. Loading then happens inside it.
  void make_context(const PipelineLoadOptions& options, const std::string& model);
  // Under model offload, releases the weights of the (name, module) components that just ran; in every case
  // marks their devices' cached activations idle (kiln::mark_cache_idle).
  void release_after_use(std::initializer_list<std::pair<const char*, nn::Module*>> ran) const;
  // The stages after a family's encode and prepare, alike in every family: the denoising loop from the task's
  // start (`model_output` at each step, with the call's noise, the inpainting blend and the request's
  // callback), the "transformer" component's memory handed on; then, unless the call returns latents,
  // `decode` (the final latents -> images [B, H, W, 3] in [0, 1]), the "vae" component's memory handed on,
  // and the output with the call's metadata (pipelines::call_metadata with `negative`: a negative prompt
  // guided the call) and `extra`.
  PipelineOutput denoise_and_decode(const pipelines::TaskCall& task, const pipelines::TaskStart& start,
                                    const std::function<Tensor(const Tensor&, int, float)>& model_output,
                                    const std::function<Tensor(const Tensor&)>& decode, bool negative,
                                    std::map<std::string, std::string> extra,
                                    const pipelines::CallControl& control);
  // diffusers' transformer.cache_context(name): the step cache state the denoiser's next evaluations use
  // ("cond"; "uncond" for true classifier-free guidance's negative call). Nothing without a cache.
  void cache_context(const std::string& name);
  // At the end of loading: sets the packed-weight plan from the components' weights in the pipeline's dtype,
  // and waits for the loading work (conversions queued on the context's stream), so that a loaded pipeline
  // holds its weights and a failure while loading is reported by from_pretrained.
  void finish_loading(const std::optional<int64_t>& requested_budget);

  std::string path_;
  std::string name_;  // what the user asked for (repo id or folder), recorded in image metadata
  std::optional<RecommendedCall> recommended_call_;  // read by make_context
  DType dtype_ = float32;
  WeightPackingPlan weight_packing_;
  bool model_cpu_offload_ = false;
  std::shared_ptr<ExecutionContext> context_;
  // Shared with the pipelines from_pipe makes of this one (they hold the same components): the queue their
  // calls take turns in, and the LoRA adapters loaded into those components.
  std::shared_ptr<pipelines::SharedPipelineState> shared_;

 private:
  // Offloading streams weights between the host's memory and the CPU's kernels: `what` is refused, naming
  // the component, while one sits on another device.
  void require_cpu(const char* what);
  // Where an offload call computes: `requested`, else where pipe.to put the transformer, else
  // default_compute_device(); checked to have a backend.
  Device offload_device(std::optional<Device> requested);
  // Before an offload onto `device`: the cpu's requirement (require_cpu), or every component's weights
  // offloaded onto the device (Module::offload_to). Lifts the memory limit an earlier budget set.
  void prepare_offload(Device device, const char* what);
  void lift_memory_limit();
  // A memory budget on a device (set_memory_budget): the plan applied, remade for a call whose activations
  // need another.
  struct DeviceBudget {
    Device device;
    int64_t bytes = 0;
    OffloadPlan plan;
  };
  std::optional<DeviceBudget> device_budget_;
  void fit_device_budget(const PipelineRequest& request);
  // configure's default on a device whose plugin reports its memory: a memory budget of what is free there
  // for Kiln; returns the line saying what was planned, or throws naming the device's figures.
  std::string plan_for_the_device_memory(const DriverMemoryReport& report, const Device& device,
                                         const std::optional<PipelineRequest>& sized_for);
  // The denoiser's step cache (kiln/nn/step_cache.h), or null; and the one a call with `request` uses (its
  // `cache`, else the enabled one; nullopt: none).
  nn::StepCache* denoiser_cache() const;
  std::optional<StepCacheConfig> call_cache(const PipelineRequest& request) const;
  // The pipeline's adapters (its siblings' too), made on first use.
  lora::LoraAdapters& lora_adapters();
};

}  // namespace kiln
