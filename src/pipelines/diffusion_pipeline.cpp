#include "kiln/pipelines/diffusion_pipeline.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "kiln/core/allocator.h"
#include "kiln/core/bytes.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/log.h"
#include "kiln/dist/call_sequencer.h"
#include "kiln/dist/process_group.h"
#include "kiln/io/model_index.h"
#include "kiln/io/model_ref.h"
#include "kiln/models/latent_codec.h"
#include "kiln/pipelines/pipeline_registry.h"
#include "kiln/runtime/device_ledger.h"
#include "pipelines/call_control.h"
#include "pipelines/model_offload.h"

namespace kiln {

DiffusionPipeline::DiffusionPipeline() : shared_(std::make_shared<pipelines::SharedPipelineState>()) {}
DiffusionPipeline::DiffusionPipeline(DiffusionPipeline&&) noexcept = default;
DiffusionPipeline::DiffusionPipeline(const DiffusionPipeline& other, SharingComponents)
    : path_(other.path_),
      name_(other.name_),
      recommended_call_(other.recommended_call_),
      dtype_(other.dtype_),
      weight_packing_(other.weight_packing_),
      model_cpu_offload_(other.model_cpu_offload_),
      context_(other.context_),
      shared_(other.shared_),
      device_budget_(other.device_budget_) {}
DiffusionPipeline& DiffusionPipeline::operator=(DiffusionPipeline&&) noexcept = default;
DiffusionPipeline::~DiffusionPipeline() = default;

std::unique_ptr<DiffusionPipeline> DiffusionPipeline::from_pretrained(const std::string& model,
                                                                      const PipelineLoadOptions& options) {
  // A whole pipeline in one file (a finetune's .safetensors): the class its family says, on the configs of
  // the folder the caller names or the family's base model.
  if (std::filesystem::is_regular_file(model)) {
    const SingleFilePipeline file = single_file_pipeline(model);
    PipelineLoadOptions with_file = options;
    with_file.single_file = model;
    const std::string config =
        options.single_file_config.empty() ? file.default_config : options.single_file_config;
    return pipeline_class(file.pipeline_class, model).load(config, with_file);
  }
  io::ResolveOptions resolve;
  resolve.revision = options.revision;
  const io::ModelIndex index = io::load_model_index(io::resolve_model(model, resolve).path);
  return pipeline_class(index.class_name, index.path).load(model, options);
}

void DiffusionPipeline::make_context(const PipelineLoadOptions& options, const std::string& model) {
  // The folder's recommended call, read before any weight loads (a bad one fails the load at once).
  recommended_call_ = RecommendedCall::read(path_);
  context_ =
      options.context ? options.context : ExecutionContext::create(std::string(class_name()) + " " + model);
}

const PipelineClass& DiffusionPipeline::registered_class() const {
  return pipeline_class(class_name(), path_);
}

void DiffusionPipeline::check_request(const PipelineRequest& request) const {
  registered_class().check_fields(request);
  check_loaded_request(request);
  const std::optional<StepCacheConfig> cache = call_cache(request);
  const nn::Module& denoiser = const_cast<DiffusionPipeline*>(this)->denoiser();
  if (cache) {
    try {
      check_step_cache(*cache);
    } catch (const Error& e) {
      throw RequestError("cache", e.what());
    }
    if (const std::string why = denoiser_cache()->refusal(*cache); !why.empty())
      throw RequestError("cache", std::string(class_name()) + ": " + why);
  }
  if (const char* name = cache ? attention_step_cache_name(*cache) : nullptr) {
    bool blocks_compiled = denoiser.is_compiled();
    for (const nn::BlockList& list : denoiser.repeated_blocks())
      blocks_compiled = blocks_compiled || (!list.blocks.empty() && list.blocks.front()->is_compiled());
    if (blocks_compiled)
      throw RequestError("cache",
                         std::string(name) +
                             " works on each attention inside the blocks, which a compiled block "
                             "program runs whole: it runs in the eager modes (--mode eager or fuse)");
  }
  if (cache && !std::holds_alternative<TaylorSeerCacheConfig>(*cache) && attention_step_cache_name(*cache) &&
      negative_evaluations(request))
    throw RequestError(
        "cache",
        std::string(attention_step_cache_name(*cache)) +
            " with classifier-free guidance whose negative prompt runs in transformer calls of its own (true "
            "CFG: a negative prompt and true_cfg_scale > 1; FLUX.2 klein and Chroma: guidance_scale > 1) is "
            "refused: "
            "like diffusers' hook it keeps one state per attention, not per guidance branch, so the "
            "negative evaluation would reuse the positive one's attention outputs and the positive "
            "the negative's (diffusers 0.42.1 mixes them, and fails where the two prompts' text lengths "
            "differ). Drop the guidance (the negative prompt or true_cfg_scale; klein and Chroma: "
            "guidance_scale 1), or use taylorseer (or, where they run, fbcache or magcache), which keep each "
            "branch apart");
  if (const auto* mag = cache ? std::get_if<MagCacheConfig>(&*cache) : nullptr;
      mag && !mag->calibrate && mag->mag_ratios.empty() && denoiser_cache()->published_mag_ratios().empty())
    throw RequestError("cache", std::string("MagCache needs the checkpoint's magnitude ratios, and none are "
                                            "published for ") +
                                    class_name() +
                                    "'s transformer: measure them with magcache:calibrate, then pass them as "
                                    "magcache:THRESHOLD:ratios=r1,r2,...");
  if (cache && denoiser.is_compiled())
    throw RequestError(
        "cache",
        "in compile mode the whole transformer is one program, so a step cache cannot "
        "decide between its blocks; compile-blocks compiles the blocks and leaves the decision "
        "to the cache (--mode compile-blocks, transformer().compile_repeated_blocks())");
}

nn::StepCache* DiffusionPipeline::denoiser_cache() const {
  // denoiser() changes nothing; it is not const because callers compile or offload what it returns.
  return const_cast<DiffusionPipeline*>(this)->denoiser().step_cache();
}

std::optional<StepCacheConfig> DiffusionPipeline::call_cache(const PipelineRequest& request) const {
  const nn::StepCache* cache = denoiser_cache();
  if (cache == nullptr) return std::nullopt;  // the class takes no `cache` field either
  if (!request.cache) return cache->config();
  if (*request.cache == "none") return std::nullopt;
  return parse_step_cache(*request.cache);
}

void DiffusionPipeline::cache_context(const std::string& name) {
  if (nn::StepCache* cache = denoiser().step_cache()) cache->set_context(name);
}

PipelineOutput DiffusionPipeline::operator()(const PipelineRequest& request) {
  check_request(request);
  // Under several ranks (MPI's processes, or in-process rank threads) every rank runs the calls in rank 0's
  // order (which also serves this pipeline's calls one at a time) and a cancellation stops every rank at the
  // same step; otherwise the pipeline's own queue does.
  const bool distributed = dist::world_size() > 1;
  std::optional<dist::CallTurn> tp_turn;
  std::optional<pipelines::CallQueue::Turn> turn;
  if (distributed)
    tp_turn.emplace(dist::admit_call(pipelines::request_key(request)));
  else
    turn.emplace(shared_->calls.wait_turn());
  ExecutionScope in(*context_);
  if (device_budget_) fit_device_budget(request);
  const pipelines::CallControl control([&](const std::string& where) {
    bool cancelled = request.cancel.cancelled();
    if (distributed) {
      context_->synchronize_all();  // no collective of this call may be in flight during the agreement
      cancelled = dist::any_rank(cancelled);
    }
    if (cancelled) throw Cancelled(std::string(class_name()) + ": cancelled " + where);
  });
  try {
    PipelineOutput out = run(request, control);
    context_->synchronize_all();
    return out;
  } catch (...) {
    // Nothing of this call may still run when the next one starts (or the pipeline goes); the error that
    // ended it is the one reported.
    try {
      context_->synchronize_all();
    } catch (...) {
    }
    throw;
  }
}

const char* execution_mode_name(ExecutionMode mode) {
  switch (mode) {
    case ExecutionMode::Eager:
      return "eager";
    case ExecutionMode::Fuse:
      return "fuse";
    case ExecutionMode::Compile:
      return "compile";
    case ExecutionMode::CompileBlocks:
      return "compile-blocks";
  }
  return "?";
}

ExecutionMode parse_execution_mode(const std::string& name) {
  for (ExecutionMode m :
       {ExecutionMode::Eager, ExecutionMode::Fuse, ExecutionMode::Compile, ExecutionMode::CompileBlocks})
    if (name == execution_mode_name(m)) return m;
  KILN_FAIL("execution mode: expected eager, fuse, compile or compile-blocks, got '" << name << "'");
}

std::vector<std::string> DiffusionPipeline::configure(const ExecutionOptions& options) {
  KILN_CHECK(
      !(options.max_memory && options.offload),
      class_name() << ".configure: max_memory picks the offload itself; give it or an offload mode, not "
                      "both");
  KILN_CHECK(options.blocks_per_group >= 1, class_name()
                                                << ".configure: blocks_per_group must be at least 1, got "
                                                << options.blocks_per_group);
  const Device device = options.device.value_or(cpu);
  const bool on_device = device.type != DeviceType::CPU;
  KILN_CHECK(!on_device || options.offload != OffloadMode::Sequential,
             class_name() << ".configure: sequential offload runs on the cpu only; onto " << device.str()
                          << " use model or group offload");
  std::vector<std::string> said;
  // Automatic: a pipeline whose weights exceed half of the machine's memory (nothing packed) frees each
  // component's pages once it has run, so that the page cache holds the transformer while it denoises.
  const bool too_big = weight_packing_.budget.has_value() && !weight_packing_.requested;
  const std::string onto = on_device ? " (onto " + device.str() + ", weights kept on the host)" : "";
  const std::optional<DriverMemoryReport> report =
      on_device && !options.max_memory && !options.offload ? driver_memory_report(device) : std::nullopt;
  if (options.max_memory) {
    said.push_back(set_memory_budget(*options.max_memory, device, options.sized_for).describe() + onto);
  } else if (report) {
    said.push_back(plan_for_the_device_memory(*report, device, options.sized_for));
  } else if (options.offload == OffloadMode::Group) {
    enable_group_offload(
        {.blocks_per_group = options.blocks_per_group, .prefetch = true, .onload_device = device});
    char line[128];
    std::snprintf(line, sizeof line,
                  "group offload: %d block(s) per group, the next group brought in while one runs",
                  options.blocks_per_group);
    said.push_back(line + onto);
  } else if (options.offload == OffloadMode::Sequential) {
    enable_sequential_cpu_offload();
    said.push_back("sequential offload: each weight is released once the next one is read");
  } else if (options.offload == OffloadMode::Model || (!options.offload && too_big)) {
    enable_model_cpu_offload(device);
    said.push_back("model offload: each component's weights are released once it has run" + onto);
  } else if (options.offload == OffloadMode::None || on_device) {
    to(device);
  }
  if (!options.mode) return said;
  // The encoders and the VAE run once per image and stay eager in the compiled modes.
  nn::Module& transformer = denoiser();
  switch (*options.mode) {
    case ExecutionMode::Eager:
    case ExecutionMode::Fuse: {
      transformer.reset_compiled();
      EagerMode eager = EagerMode::DeferAndFuse;
      if (*options.mode == ExecutionMode::Eager)
        eager = eager_mode_from_environment() == EagerMode::DeferNeverLaunchBlocking
                    ? EagerMode::DeferNeverLaunchBlocking
                    : EagerMode::DeferNever;
      context_->set_eager_mode(eager);
      break;
    }
    case ExecutionMode::Compile:
      context_->set_eager_mode(std::nullopt);
      transformer.compile({.fullgraph = true, .dynamic = false});
      break;
    case ExecutionMode::CompileBlocks:
      context_->set_eager_mode(std::nullopt);
      transformer.compile_repeated_blocks();
      break;
  }
  return said;
}

std::string DiffusionPipeline::plan_for_the_device_memory(const DriverMemoryReport& report,
                                                          const Device& device,
                                                          const std::optional<PipelineRequest>& sized_for) {
  // Kiln's own arrays there (a pipeline moved before) are the budget's to plan; the rest is others'.
  const int64_t others = std::max<int64_t>(report.in_use_bytes - memory_stats(device).current_bytes, 0);
  const int64_t free_for_kiln = report.limit_bytes - others;
  const std::string reported = device.str() + " has " + format_bytes(report.limit_bytes) +
                               " (its plugin says), " + format_bytes(others) + " of it in use by others";
  KILN_CHECK(free_for_kiln > 0, class_name() << ": " << reported << ": nothing is left for the pipeline");
  try {
    return set_memory_budget(free_for_kiln, device, sized_for).describe() + " (" + reported +
           "; weights kept on the host)";
  } catch (const Error& e) {
    KILN_FAIL(reported << ", so " << class_name() << " plans for " << format_bytes(free_for_kiln)
                       << " there: " << e.what());
  }
}

void DiffusionPipeline::enable_sequential_cpu_offload(int64_t resident_bytes) {
  ExecutionScope in(*context_);
  require_cpu("enable_sequential_cpu_offload");
  lift_memory_limit();
  model_cpu_offload_ = pipelines::apply_offload(
      {.mode = OffloadMode::Sequential, .budget = std::max<int64_t>(resident_bytes, 0)}, components());
}

void DiffusionPipeline::enable_group_offload(const GroupOffloadOptions& options) {
  ExecutionScope in(*context_);
  prepare_offload(offload_device(options.onload_device), "enable_group_offload");
  model_cpu_offload_ = pipelines::apply_offload({.mode = OffloadMode::Group, .group = options}, components());
}

void DiffusionPipeline::enable_model_cpu_offload(std::optional<Device> device) {
  ExecutionScope in(*context_);
  const Device on = offload_device(device);
  prepare_offload(on, "enable_model_cpu_offload");
  pipelines::clear_offload(weight_packing_);
  // Onto a device, nothing is there until a component runs (a pipeline that ran holds copies there).
  if (on.type != DeviceType::CPU)
    for (const auto& [name, module] : components())
      if (module != nullptr) module->release_weights();
  model_cpu_offload_ = true;
  if (log_enabled("offload"))
    log("offload", "model offload: each component on " + on.str() + " while it runs");
}

void DiffusionPipeline::to(const Device& device) {
  ExecutionScope in(*context_);
  device_runtime(device);  // throws, naming the device (and the plugin to install), when nothing drives it
  const auto all = components();
  for (const auto& [name, module] : all)
    if (module != nullptr) module->check_movable_to(device);
  pipelines::clear_offload(weight_packing_);
  lift_memory_limit();
  model_cpu_offload_ = false;
  for (const auto& [name, module] : all)
    if (module != nullptr) module->to(device);
  // The copies run on the context's stream: wait for them, so that pipe.to returns with the weights on the
  // device (its memory counted, a failure such as the device's out of memory raised here, not at a later
  // call).
  context_->synchronize_all();
  if (log_enabled("offload")) log("offload", "every component resident on " + device.str());
}

void DiffusionPipeline::component_to(const std::string& component, const Device& device) {
  ExecutionScope in(*context_);
  std::string names;
  for (const auto& [name, module] : components()) {
    if (module == nullptr) continue;
    if (name == component) {
      device_runtime(device);
      KILN_CHECK(!model_cpu_offload_ || device.type == DeviceType::CPU,
                 class_name() << "." << component << ".to(" << device.str()
                              << "): the pipeline offloads its weights on the cpu; call pipe.to(\""
                              << device.str() << "\") instead, which turns offloading off");
      module->to(device);
      context_->synchronize_all();  // as pipe.to: the weights are there when this returns
      return;
    }
    names += (names.empty() ? "" : ", ") + name;
  }
  KILN_FAIL(class_name() << " has no component '" << component << "' (it has " << names << ")");
}

Device DiffusionPipeline::device() {
  return denoiser().device();
}

void DiffusionPipeline::require_cpu(const char* what) {
  for (const auto& [name, module] : components())
    if (module != nullptr && module->device().type != DeviceType::CPU)
      KILN_FAIL(class_name() << "." << what << ": " << name << " is on " << module->device().str() << "; "
                             << what << " runs on the cpu only for now (call pipe.to(\"cpu\") first)");
}

Device DiffusionPipeline::offload_device(std::optional<Device> requested) {
  if (!requested) {
    const Device placed = device();
    if (placed.type != DeviceType::CPU) return placed;
  }
  return pipelines::offload_compute_device(requested);
}

void DiffusionPipeline::prepare_offload(Device device, const char* what) {
  lift_memory_limit();
  if (device.type == DeviceType::CPU) {
    require_cpu(what);
    return;
  }
  const auto all = components();
  for (const auto& [name, module] : all)
    if (module != nullptr) module->check_movable_to(device);
  for (const auto& [name, module] : all)
    if (module != nullptr) module->offload_to(device);
  if (log_enabled("offload"))
    log("offload",
        std::string(what) + ": weights kept on the host, copied to " + device.str() + " as they run");
}

void DiffusionPipeline::lift_memory_limit() {
  if (device_budget_) {
    ExecutionScope in(*context_);  // the limit is this pipeline's context's (kiln/runtime/device_ledger.h)
    set_memory_limit(device_budget_->device, std::nullopt);
  }
  device_budget_.reset();
}

OffloadPlan DiffusionPipeline::plan_device_budget(int64_t bytes, const Device& device,
                                                  const PipelineRequest& request) const {
  // The weights alone first: a budget they cannot fit in is refused for them, whatever the call.
  pipelines::plan_device_offload(components(), bytes, device);
  const ActivationEstimate activations = estimate_activations(request, device);
  const int64_t for_weights = bytes - activations.peak();
  const auto refuse = [&](const std::string& why) {
    KILN_FAIL(
        "memory budget " << format_bytes(bytes) << " on " << device.str() << " keeps "
                         << activations.describe() << " free (an estimate), which leaves "
                         << format_bytes(std::max<int64_t>(for_weights, 0)) << " for the weights: " << why
                         << ". Give a larger --max-memory, a smaller image, or --vae-tiling when the VAE "
                            "needs the most");
  };
  if (for_weights <= 0) refuse("none");
  try {
    OffloadPlan plan = pipelines::plan_device_offload(components(), for_weights, device);
    plan.activations = activations.peak();
    return plan;
  } catch (const Error& e) {
    refuse(e.what());
  }
  return {};
}

std::optional<OffloadPlan> DiffusionPipeline::device_memory_plan() const {
  if (!device_budget_) return std::nullopt;
  return device_budget_->plan;
}

void DiffusionPipeline::fit_device_budget(const PipelineRequest& request) {
  const OffloadPlan plan = plan_device_budget(device_budget_->bytes, device_budget_->device, request);
  const OffloadPlan& applied = device_budget_->plan;
  if (plan.mode == applied.mode && plan.group.blocks_per_group == applied.group.blocks_per_group) return;
  if (log_enabled("offload")) log("offload", "this call needs another plan under the memory budget");
  model_cpu_offload_ = pipelines::apply_offload(plan, components());
  device_budget_->plan = plan;
}

OffloadPlan DiffusionPipeline::set_memory_budget(int64_t bytes, std::optional<Device> device,
                                                 const std::optional<PipelineRequest>& sized_for) {
  ExecutionScope in(*context_);
  const Device on = offload_device(device);
  if (on.type == DeviceType::CPU) {
    require_cpu("set_memory_budget");
    const OffloadPlan plan = plan_offload(components(), bytes);
    model_cpu_offload_ = pipelines::apply_offload(plan, components());
    return plan;
  }
  // Planned for `sized_for`; each call plans again for its own (fit_device_budget). Without one, a budget too
  // small for the default size's activations may still suit smaller images: the weights alone must fit here,
  // and each call is refused before it starts when its own activations do not.
  OffloadPlan plan;
  if (sized_for) {
    plan = plan_device_budget(bytes, on, *sized_for);
  } else {
    try {
      plan = plan_device_budget(bytes, on, PipelineRequest{});
    } catch (const Error&) {
      plan = pipelines::plan_device_offload(components(), bytes, on);
    }
  }
  prepare_offload(on, "set_memory_budget");
  model_cpu_offload_ = pipelines::apply_offload(plan, components());
  set_memory_limit(on, bytes);
  device_budget_ = DeviceBudget{on, bytes, plan};
  return plan;
}

void DiffusionPipeline::enable_vae_tiling(int64_t tile_size) {
  latent_codec().set_tiling(tile_size);
}

void DiffusionPipeline::disable_vae_tiling() {
  latent_codec().set_tiling(std::nullopt);
}

void DiffusionPipeline::release_after_use(
    std::initializer_list<std::pair<const char*, nn::Module*>> ran) const {
  if (model_cpu_offload_) pipelines::release_after_use(ran);
  // The next component asks for other sizes: the cached activations of these are the first to recycle.
  for (const auto& [name, module] : ran)
    if (module != nullptr) mark_cache_idle(module->device());
}

PipelineDefaults DiffusionPipeline::defaults() const {
  return recommended_call_ ? recommended_call_->over(family_defaults()) : family_defaults();
}

std::string DiffusionPipeline::defaults_source() const {
  if (recommended_call_) return recommended_call_->path;
  return std::string("the family's defaults (") + class_name() + ")";
}

void DiffusionPipeline::finish_loading(const std::optional<int64_t>& requested_budget) {
  size_t bytes = 0;
  for (const auto& [name, module] : components())
    if (module != nullptr) bytes += module->parameter_bytes(dtype_);
  ExecutionScope in(*context_);
  weight_packing_ = apply_weight_packing(static_cast<int64_t>(bytes), requested_budget);
  context_->synchronize_all();
}

}  // namespace kiln
