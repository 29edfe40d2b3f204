// PEFT's LoraLayer for Kiln's layers (nn::Linear, nn::Conv2d in kiln/nn/layers.h): the LoRA adapters a layer
// holds (diffusers' load_lora_weights), the one combined low-rank pair its forward reads, and fusing them
// into its weight and back. The bookkeeping is the same for every kind of layer; what differs (the shapes a
// pair takes, a tensor-parallel rank's slice of it, how the merged delta lands in the weight) is the layer's.
//
// Each adapter is a pair down (A) and up (B) with its scale (alpha / rank): a Linear's down [rank, in] and up
// [out, rank]; a convolution's down [rank, in, kh, kw] (a convolution with the layer's kernel, stride and
// padding) and up [out, rank, 1, 1]. The layer adds sum_i w_i * scale_i * B_i (A_i x) for its active
// adapters (w_i: set_adapters' weights) as ONE low-rank pair beside the base weight, which stays as it is:
// lora_down holds the active A_i stacked along the rank, lora_up the B_i side by side with w_i * scale_i
// folded in (in float32, before the one rounding to the layer's dtype). Both are runtime inputs of the
// module, so a compiled program takes them as inputs: new adapters or weights of the same total rank never
// recompile. Without active adapters (lora_down undefined) the forward is exactly the plain layer's.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::nn {

class LoraLayer {
 public:
  LoraLayer();
  virtual ~LoraLayer();
  LoraLayer(const LoraLayer&) = delete;
  LoraLayer& operator=(const LoraLayer&) = delete;

  // Adds adapter `name` (replacing one of that name): the whole layer's pair in any floating dtype (a
  // tensor-parallel rank keeps its slice); `scale` is alpha / rank. It is inactive until set_active_adapters
  // names it. Throws naming the shapes when they do not fit the layer.
  void add_adapter(const std::string& name, const Tensor& down, const Tensor& up, double scale);
  // Removes adapter `name` (inactive or not); absent names are ignored.
  void delete_adapter(const std::string& name);
  bool has_adapter(const std::string& name) const;
  std::vector<std::string> adapter_names() const;
  // The adapters the forward adds, each with its weight, in this order (names this layer does not hold are
  // skipped: an adapter rarely touches every layer); rebuilds lora_down / lora_up. Refused while fused.
  void set_active_adapters(const std::vector<std::pair<std::string, double>>& weights);
  // PEFT's scale_layer + merge: the active adapters' weights are multiplied by `lora_scale` (they keep it
  // after unfuse_adapters, as in diffusers) and their sum is added into the weight, computed in float32 and
  // rounded once. The weight becomes an owned copy in the compute dtype (a quantized Linear's, GGUF or fp8,
  // is dequantized); the original is kept, untouched, for unfuse_adapters. No-op without active adapters.
  void fuse_adapters(double lora_scale);
  // The original weight (and its storage type) back, bit for bit; the adapters run unfused again.
  void unfuse_adapters();
  bool is_fused() const;
  // Drops every adapter. A fused weight stays fused (diffusers' unload_lora_weights after fuse_lora).
  void clear_adapters();
  // The combined low-rank pair the forward reads (undefined without active adapters or while fused).
  const Tensor& lora_down() const { return lora_down_; }
  const Tensor& lora_up() const { return lora_up_; }

 protected:
  // "Linear", "Conv2d": the layer in messages.
  virtual const char* lora_layer_kind() const = 0;
  // The pair this layer keeps of the whole layer's (down, up) (a tensor-parallel rank's slices); throws
  // naming the adapter and the shapes when they do not fit.
  virtual std::pair<Tensor, Tensor> adapter_pair(const std::string& name, const Tensor& down,
                                                 const Tensor& up) const = 0;
  // Where the combined pair runs: the layer's compute dtype, its weight's device.
  virtual DType adapter_dtype() const = 0;
  virtual Device adapter_device() const = 0;
  // Replaces the weight by the original plus `delta` (float32, up @ down with up [out, rank] and down
  // [rank, the rest of the weight's dims flattened], on the weight's device), rounded once to the compute
  // dtype, keeping the original as it is for restore_weight.
  virtual void merge_into_weight(const Tensor& delta) = 0;
  // The original weight back, where the merged one is now (the pipeline may have moved since fusing).
  virtual void restore_weight() = 0;
  // Forgets the original (the merged weight stays).
  virtual void drop_original_weight() = 0;

  // The combined pair, registered by the layer as runtime inputs.
  Tensor lora_down_, lora_up_;

 private:
  struct Adapters;
  void rebuild_adapters();
  std::unique_ptr<Adapters> adapters_;  // null until an adapter is added
};

}  // namespace kiln::nn
