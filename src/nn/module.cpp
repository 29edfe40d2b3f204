#include "kiln/nn/module.h"

#include <cxxabi.h>

#include <cstdlib>
#include <typeinfo>

#include "kiln/core/device_runtime.h"
#include "kiln/ops/layout.h"
#include "kiln/runtime/execution_context.h"
#include "kiln/runtime/weight_groups.h"
#include "nn/compiled_forward.h"
#include "runtime/capture.h"

#include <set>

namespace kiln::nn {

void Module::register_parameter(const std::string& name, Tensor* slot, Shape shape, bool optional) {
  Shape full = shape;
  parameters_.push_back(Parameter{
      .name = name, .slot = slot, .shape = std::move(shape), .optional = optional, .full_shape = full});
}

void Module::register_sharded_parameter(const std::string& name, Tensor* slot, const Shape& full_shape,
                                        ParameterShard shard) {
  Shape local = full_shape;
  local.at(static_cast<size_t>(shard.dim)) = shard.local_extent();
  parameters_.push_back(Parameter{.name = name,
                                  .slot = slot,
                                  .shape = std::move(local),
                                  .optional = false,
                                  .full_shape = full_shape,
                                  .shard = std::move(shard)});
}

Tensor WeightSource::load_slices(const std::string& name, int dim,
                                 const std::vector<std::pair<int64_t, int64_t>>& ranges) const {
  const Tensor whole = load(name);
  std::vector<Tensor> pieces;
  for (const auto& [start, end] : ranges)
    pieces.push_back(whole.narrow(dim, start, end - start).contiguous());
  return pieces.size() == 1 ? pieces.front() : concat(pieces, dim);
}

void Module::register_quantizable_parameter(const std::string& name, Tensor* slot, Shape shape,
                                            QuantizedStorage* storage) {
  Shape full = shape;
  parameters_.push_back(Parameter{.name = name,
                                  .slot = slot,
                                  .shape = std::move(shape),
                                  .optional = false,
                                  .quantized = storage,
                                  .full_shape = full});
}

void Module::set_checkpoint_shape(const std::string& name, Shape stored) {
  for (Parameter& p : parameters_) {
    if (p.name != name) continue;
    KILN_CHECK(!p.shard && shape_numel(stored) == shape_numel(p.shape),
               type_name() << ": parameter '" << name << "' of shape " << shape_str(p.shape)
                           << " cannot be stored as " << shape_str(stored));
    p.full_shape = std::move(stored);
    return;
  }
  KILN_FAIL(type_name() << ": no parameter '" << name << "' to set the checkpoint shape of");
}

void Module::register_module(const std::string& name, Module* child) {
  children_.emplace_back(name, child);
}

void Module::register_runtime_input(Tensor* slot) {
  runtime_inputs_.push_back(slot);
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> out{{prefix, this}};
  for (const auto& [name, child] : children_) {
    auto below = child->named_modules(prefix.empty() ? name : prefix + "." + name);
    out.insert(out.end(), below.begin(), below.end());
  }
  return out;
}

void Module::collect_runtime_inputs(std::vector<Tensor>& out) const {
  for (const Tensor* slot : runtime_inputs_) out.push_back(*slot);
  for (const auto& [name, child] : children_) child->collect_runtime_inputs(out);
}

void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, const Parameter*>>& out) const {
  for (const auto& p : parameters_) out.emplace_back(prefix + p.name, &p);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor*>> Module::named_parameters(const std::string& prefix) {
  std::vector<std::pair<std::string, const Parameter*>> all;
  collect(prefix, all);
  std::vector<std::pair<std::string, Tensor*>> out;
  out.reserve(all.size());
  for (const auto& [name, p] : all) out.emplace_back(name, p->slot);
  return out;
}

std::vector<std::pair<std::string, Shape>> Module::parameter_shapes(const std::string& prefix) {
  std::vector<std::pair<std::string, const Parameter*>> all;
  collect(prefix, all);
  std::vector<std::pair<std::string, Shape>> out;
  out.reserve(all.size());
  // A parameter stored in another shape than it runs in (a pointwise convolution's weight run as a Linear's)
  // is named in the checkpoint's; a tensor-parallel rank's slice in its own.
  for (const auto& [name, p] : all) out.emplace_back(name, p->shard ? p->shape : p->full_shape);
  return out;
}

int64_t Module::num_parameters() {
  std::vector<std::pair<std::string, const Parameter*>> all;
  collect("", all);
  int64_t n = 0;
  for (const auto& [name, p] : all) n += shape_numel(p->shape);
  return n;
}

size_t Module::parameter_bytes(DType dtype) {
  std::vector<std::pair<std::string, const Parameter*>> all;
  collect("", all);
  size_t bytes = 0;
  for (const auto& [name, p] : all)
    // A weight kept block-quantized occupies its blocks, whatever the compute dtype.
    bytes += p->quantized != nullptr && p->quantized->is_quantized()
                 ? p->slot->nbytes()
                 : static_cast<size_t>(shape_numel(p->shape)) * dtype_size(dtype);
  return bytes;
}

void Module::load_weights(const WeightSource& source, const LoadOptions& options) {
  std::vector<std::pair<std::string, const Parameter*>> all;
  collect("", all);
  std::set<std::string> used;
  std::vector<std::string> missing;
  for (const auto& [name, p] : all) {
    if (!source.contains(name)) {
      if (!p->optional) missing.push_back(name);
      continue;
    }
    const Shape stored = source.shape(name);
    KILN_CHECK(stored == p->full_shape, source.description()
                                            << ": tensor '" << name << "' has shape " << shape_str(stored)
                                            << " but the model config expects " << shape_str(p->full_shape));
    const bool reshaped = !p->shard && p->full_shape != p->shape;
    if (p->quantized != nullptr) {
      *p->quantized = QuantizedStorage{quant::StorageType::F32, options.dtype};
      if (options.keep_quantized && !reshaped) {
        quant::QuantizedTensor q = source.load_quantized(name);
        if (q.defined() && quant::traits(q.type).is_quantized) {
          *p->slot = q.blocks;
          p->quantized->type = q.type;
          used.insert(name);
          if (options.on_loaded) options.on_loaded(name, p->slot->nbytes());
          continue;
        }
      }
    }
    Tensor t = p->shard ? source.load_slices(name, p->shard->dim, p->shard->ranges()) : source.load(name);
    if (reshaped) t = t.reshape(p->shape);
    *p->slot = t.to(options.dtype);
    used.insert(name);
    if (options.on_loaded) options.on_loaded(name, p->slot->nbytes());
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) list += ", ...";
    KILN_FAIL(source.description() << ": " << missing.size()
                                   << " tensor(s) the model needs are missing: " << list);
  }
  std::vector<std::string> unexpected;
  for (const auto& name : source.names()) {
    if (used.count(name)) continue;
    bool ignored = false;
    for (const auto& prefix : options.ignore_prefixes) ignored |= name.rfind(prefix, 0) == 0;
    if (!ignored) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    std::string list;
    for (size_t i = 0; i < unexpected.size() && i < 5; ++i) list += (i ? ", " : "") + unexpected[i];
    if (unexpected.size() > 5) list += ", ...";
    KILN_FAIL(source.description() << ": " << unexpected.size()
                                   << " tensor(s) do not belong to the model described by its config: "
                                   << list);
  }
}

void Module::enable_cache(const StepCacheConfig& config) {
  StepCache* cache = step_cache();
  KILN_CHECK(cache != nullptr, type_name() << " takes no step cache (the transformers of FLUX.1, FLUX.2, "
                                              "Qwen-Image and Chroma do: docs/step_caching.md)");
  check_step_cache(config);
  cache->enable(config);
}

void Module::disable_cache() {
  if (StepCache* cache = step_cache()) cache->disable();
}

size_t Module::release_weights() {
  synchronize(device());   // the kernels still queued there read these weights
  stop_weight_prefetch();  // group offload's prefetch thread must not map them back
  size_t released = 0;
  std::set<const Storage*> seen;  // views of one storage (a fused qkv weight) are released once
  for (const Tensor& t : parameter_tensors()) {
    if (!t.defined() || !t.storage()->can_send_out() || !seen.insert(t.storage().get()).second) continue;
    released += t.storage()->bytes();
    t.storage()->clear_derived();
    device_runtime(t.storage()->device()).weight_tier().evict(*t.storage());
  }
  return released;
}

void Module::compile(const CompileOptions& options) {
  KILN_CHECK(supports_compile(), type_name()
                                     << ".compile: this module's forward cannot be compiled; compile the "
                                        "denoising transformer (or its blocks with compile_repeated_blocks)");
  compiled_ = std::make_shared<CompiledForward>(options, type_name());
}

void Module::reset_compiled() {
  compiled_.reset();
  for (auto& [name, child] : children_) child->reset_compiled();
}

void Module::compile_repeated_blocks() {
  const std::vector<BlockList> lists = repeated_blocks();
  KILN_CHECK(!lists.empty(),
             type_name() << ".compile_repeated_blocks: this module has no repeated blocks to compile");
  // Checked for every list first, so that a refusal leaves nothing half compiled.
  for (const BlockList& list : lists)
    KILN_CHECK(list.blocks.empty() || list.blocks.front()->supports_compile(),
               type_name() << ".compile_repeated_blocks: the blocks of " << list.name << " ("
                           << list.blocks.front()->type_name() << ") cannot be compiled");
  // Compiled programs take the weights as inputs, so the first block's cache serves its whole list; blocks
  // whose structures differ (SD3's) get a program each in it, keyed by their parameters' shapes.
  for (const BlockList& list : lists) {
    if (list.blocks.empty()) continue;
    list.blocks.front()->compile();
    for (size_t i = 1; i < list.blocks.size(); ++i)
      list.blocks[i]->share_compiled_cache(*list.blocks.front());
  }
}

size_t Module::compiled_program_count() const {
  return compiled_ ? compiled_->program_count() : 0;
}

void Module::share_compiled_cache(const Module& other) {
  KILN_CHECK(other.compiled_ != nullptr,
             type_name() << ": the module to share a compiled cache with is not compiled");
  compiled_ = other.compiled_;
}

std::vector<Tensor> Module::parameter_tensors() const {
  std::vector<std::pair<std::string, const Parameter*>> all;
  collect("", all);
  std::vector<Tensor> out;
  out.reserve(all.size());
  for (const auto& [name, prm] : all) out.push_back(*prm->slot);
  collect_runtime_inputs(out);
  return out;
}

std::string Module::type_name() const {
  const char* mangled = typeid(*this).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

std::vector<Tensor> Module::call_compiled(
    const std::vector<Tensor>& inputs,
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& eager,
    const std::string& extra_key) const {
  // Inside another module's trace (a compiled transformer whose blocks were compiled too), the block is
  // simply part of the outer graph.
  if (!compiled_ || runtime::capture_target() != nullptr) return eager(inputs);
  // Block formats with equal row sizes (Q4_0 and Q4_K, Q5_0 and Q5_K) give equal parameter signatures, and
  // the storage type is an attribute of the traced calls: it must be part of the key.
  std::string key = extra_key;
  std::vector<std::pair<std::string, const Parameter*>> all;
  collect("", all);
  for (const auto& [name, p] : all)
    if (p->quantized != nullptr && p->quantized->is_quantized())
      key += "|" + std::string(quant::type_name(p->quantized->type));
  return compiled_->call(inputs, parameter_tensors(), eager, key);
}

}  // namespace kiln::nn
