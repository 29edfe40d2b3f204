// Module: a named tree of parameters, like torch.nn.Module, so that a model's weights load from a
// diffusers/transformers checkpoint by the same dotted names ("transformer_blocks.0.attn.to_q.weight").
// Modules register their parameter tensors and child modules (members) in their constructor; since the
// registry keeps pointers to those members, modules are neither copyable nor movable — hold them by value
// inside their parent or by unique_ptr in lists.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/nn/compile.h"
#include "kiln/nn/step_cache.h"
#include "kiln/nn/tensor_parallel.h"
#include "kiln/quant/quantized_tensor.h"

namespace kiln::nn {

class CompiledForward;
class Module;
class StepCache;

// One list of a module's repeated blocks: the blocks registered as "<name>.0", "<name>.1", ... under the
// module ("transformer_blocks"), in the order they run.
struct BlockList {
  std::string name;
  std::vector<Module*> blocks;
};

// The BlockList of blocks held by unique_ptr, as the models hold them.
template <class Block>
BlockList block_list(std::string name, const std::vector<std::unique_ptr<Block>>& blocks) {
  BlockList list{std::move(name), {}};
  list.blocks.reserve(blocks.size());
  for (const auto& block : blocks) list.blocks.push_back(block.get());
  return list;
}

// Where weights come from: a checkpoint addressed by tensor name (one file or shards).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool contains(const std::string& name) const = 0;
  virtual Shape shape(const std::string& name) const = 0;
  // The tensor as stored (a zero-copy view where possible).
  virtual Tensor load(const std::string& name) const = 0;
  virtual std::vector<std::string> names() const = 0;
  // The pieces [start, end) of `name` along `dim`, concatenated in order (a tensor-parallel rank's shard).
  // The default slices what load() returns; a file-backed source reads only those bytes.
  virtual Tensor load_slices(const std::string& name, int dim,
                             const std::vector<std::pair<int64_t, int64_t>>& ranges) const;
  // Names the source in errors ("transformer/diffusion_pytorch_model.safetensors").
  virtual std::string description() const = 0;
  // The tensor's quantized storage (GGUF Q8_0, Q4_K, ...; a safetensors fp8 matrix) when it has one; an
  // undefined result for tensors stored as plain floats, which is every tensor of a source without
  // quantized storage.
  virtual quant::QuantizedTensor load_quantized(const std::string& name) const { return {}; }
};

// How a quantizable parameter (a Linear weight) was loaded: kept in its block format (or fp8), or plain.
struct QuantizedStorage {
  quant::StorageType type = quant::StorageType::F32;  // F32: not quantized (the slot holds a plain tensor)
  DType compute_dtype = float32;                      // the dtype the layer computes in (LoadOptions::dtype)
  bool is_quantized() const { return quant::traits(type).is_quantized; }
};

struct LoadOptions {
  DType dtype = float32;  // parameters are converted to this dtype (no copy when already stored so)
  // Checkpoint tensors that no parameter uses are an error unless they match one of these name prefixes
  // (for tensors a pipeline deliberately ignores, such as an unused encoder).
  std::vector<std::string> ignore_prefixes;
  // Quantizable parameters (Linear weights) stored block-quantized (GGUF) or in fp8 (safetensors) by the
  // source stay in that format in memory (the slot then holds the raw blocks or bytes, uint8 [rows,
  // row_bytes]); false dequantizes them to `dtype` like any other tensor.
  bool keep_quantized = true;
  // Called with (name, bytes) after each parameter is loaded; used for progress reporting.
  std::function<void(const std::string&, size_t)> on_loaded;
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter with its full dotted name, in registration order.
  std::vector<std::pair<std::string, Tensor*>> named_parameters(const std::string& prefix = "");
  // This module and every module under it with its full dotted name ("" for this one, then
  // "transformer_blocks.0", "transformer_blocks.0.attn", ...), in registration order.
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");
  // Every parameter's full dotted name and the shape the checkpoint must hold (set_checkpoint_shape's where
  // set; a tensor-parallel rank's slice in its local shape).
  std::vector<std::pair<std::string, Shape>> parameter_shapes(const std::string& prefix = "");
  int64_t num_parameters();
  // Bytes the parameters occupy (after loading) or would occupy in `dtype`; weights kept block-quantized
  // count at their quantized size.
  size_t parameter_bytes(DType dtype);

  // Loads every parameter from `source`, checking that each exists with the registered shape, and that the
  // source holds nothing unexpected. Errors name the tensor, the source, and the expected and found shapes.
  void load_weights(const WeightSource& source, const LoadOptions& options = {});

  // This module's lists of repeated blocks, in the order they run: what compile_repeated_blocks shares one
  // program between and what group offload streams in groups (kiln/nn/block_positions.h says which block
  // each parameter belongs to). None by default; weights outside every block stay while the module runs.
  virtual std::vector<BlockList> repeated_blocks() const { return {}; }

  // ---- step caching (kiln/nn/step_cache.h)
  // The step cache a transformer runs its repeated blocks through; null for a module that takes none.
  virtual StepCache* step_cache() const { return nullptr; }
  // diffusers' transformer.enable_cache(config) / disable_cache(): the cache every call uses unless its
  // request names its own. Throws naming the module when it takes none.
  void enable_cache(const StepCacheConfig& config);
  void disable_cache();

  // Offloading on a host without an accelerator: frees the packed copies of this module's weights and hands
  // their checkpoint file pages back to the OS (page cache included), so the module holds no memory until it
  // runs again and reads them from the file. Offloaded onto a device (offload_to): frees the device's copies
  // too. Waits for queued work first (a queued kernel may still read a packed copy). Weights that are not
  // file pages or offloaded (converted or owned copies) stay as they are. Returns the bytes of weights
  // released (file pages, device copies' host bytes and packed copies).
  size_t release_weights();

  // torch's module.to(device): every parameter and runtime input replaced by its copy on `device` (kept as
  // they are when already there), so that the forward runs where its weights are. Everything is checked
  // before anything moves: a weight kept block-quantized (GGUF) has no kernel off the CPU, so moving it is an
  // error naming the parameter, and the module stays where it was. A weight kept in fp8 is widened to the
  // layer's compute dtype first (its exact values; it stays so when moved back).
  void to(Device device);
  // The check to() makes before moving anything (a pipeline checks every component before moving one).
  void check_movable_to(Device device) const;
  // Offloading onto a device with memory of its own (a PJRT device): every weight stays on the host (a
  // weight on another device is copied back first) and its slot holds the device's offloaded form of it
  // (WeightTier::offloaded), copied to the device when read or brought in and freed there when sent out;
  // runtime inputs move to `device`. Kept as they are when already offloaded there. Checked as to() is.
  void offload_to(Device device);
  // The device of the first defined parameter (cpu for a module without any).
  Device device() const;
  // `x` on device() (x itself when already there or undefined): the models' forwards take their inputs from
  // the host (token ids, positions, timesteps) or from another component, and run where their weights are.
  Tensor on_weights_device(const Tensor& x) const;

  // ---- compiled mode (kiln/nn/compile.h)
  // Compiles this module's forward: each input signature is traced once into an optimised program that
  // later calls reuse. Only modules whose forward supports it (the transformers, their blocks) can be
  // compiled; others throw. Calling it again replaces the cache.
  void compile(const CompileOptions& options = {});
  // Compiles the first block of each of repeated_blocks()' lists and makes the list's other blocks share its
  // cache (FLUX: one program for the double-stream blocks, one for the single-stream blocks; SD3: one cache
  // for the joint blocks, holding a program per distinct block structure). Throws for modules without
  // repeated blocks.
  void compile_repeated_blocks();
  bool is_compiled() const { return compiled_ != nullptr; }
  // Back to eager: drops this module's and its submodules' compiled caches.
  void reset_compiled();
  // The number of programs this module's compiled cache holds (shared with its sibling blocks).
  size_t compiled_program_count() const;
  // Makes this module use `other`'s compiled cache (repeated blocks share one; `other` must be compiled).
  void share_compiled_cache(const Module& other);

 protected:
  // Registers `slot` (a member) as parameter `name` of shape `shape`. Optional parameters may be absent
  // from the checkpoint, in which case the slot stays undefined.
  void register_parameter(const std::string& name, Tensor* slot, Shape shape, bool optional = false);
  // Registers a parameter that may stay block-quantized when loaded (see LoadOptions::keep_quantized);
  // `storage` records how it was loaded.
  void register_quantizable_parameter(const std::string& name, Tensor* slot, Shape shape,
                                      QuantizedStorage* storage);
  // Registers a tensor-parallel rank's slice of a parameter whose checkpoint shape is `full_shape`: the
  // registered shape is the slice's, and load_weights reads only the slice (kiln/nn/tensor_parallel.h).
  void register_sharded_parameter(const std::string& name, Tensor* slot, const Shape& full_shape,
                                  ParameterShard shard);
  // The checkpoint stores parameter `name` (registered, not sharded) as `stored`, a shape of as many values
  // (a 1x1 convolution's [out, in, 1, 1] for a Linear's [out, in]): load_weights takes that shape and
  // reshapes it to the registered one (a view, no copy); it is never kept block-quantized.
  void set_checkpoint_shape(const std::string& name, Shape stored);
  // `name` may be dotted ("self_attn.q_proj") to reproduce a checkpoint's nesting without scope modules.
  void register_module(const std::string& name, Module* child);
  // Registers `slot` (a member) as a tensor the forward reads besides the parameters, set at run time rather
  // than loaded (a LoRA layer's low-rank pair, kiln/nn/lora_layer.h). Compiled programs take it as an input
  // like a parameter, so a new value of the same shape never recompiles; it is not loaded, counted, packed
  // by the weight plans or offloaded. An undefined slot is simply absent.
  void register_runtime_input(Tensor* slot);

  // Whether this module's forward goes through call_compiled (compile() refuses the others).
  virtual bool supports_compile() const { return false; }
  // For forward implementations: runs `eager(inputs)` directly when not compiled, else through the compiled
  // cache; `extra_key` names what besides input shapes changes the traced graph (non-tensor arguments).
  std::vector<Tensor> call_compiled(
      const std::vector<Tensor>& inputs,
      const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& eager,
      const std::string& extra_key = "") const;
  // Every parameter tensor (undefined slots included), in named_parameters() order, then every runtime input
  // (register_runtime_input) in registration order: what a compiled program binds at each run.
  std::vector<Tensor> parameter_tensors() const;
  // The class name for messages ("FluxTransformerBlock").
  std::string type_name() const;

 private:
  struct Parameter {
    std::string name;
    Tensor* slot;
    Shape shape;
    bool optional;
    QuantizedStorage* quantized = nullptr;
    Shape full_shape;  // the checkpoint's shape (== shape unless sharded or set_checkpoint_shape)
    std::optional<ParameterShard> shard;  // set for a tensor-parallel slice
  };
  void collect(const std::string& prefix, std::vector<std::pair<std::string, const Parameter*>>& out) const;
  void collect_runtime_inputs(std::vector<Tensor>& out) const;
  void move_runtime_inputs(Device device);
  // to() and offload_to() onto a device other than the CPU: fp8-kept weights become plain tensors of their
  // compute dtype (module_device.cpp).
  void widen_fp8_weights_for(Device device);
  const Tensor* first_defined_parameter() const;

  std::vector<Parameter> parameters_;
  std::vector<Tensor*> runtime_inputs_;
  std::vector<std::pair<std::string, Module*>> children_;
  std::shared_ptr<CompiledForward> compiled_;
};

}  // namespace kiln::nn
