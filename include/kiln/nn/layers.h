// The standard layers, with the parameter names torch uses ("weight", "bias"), so checkpoints load by name.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/nn/module.h"
#include "kiln/nn/tensor_parallel.h"
#include "kiln/ops/nn.h"

namespace kiln::nn {

// torch.nn.Linear: weight [out, in], optional bias [out]. A weight that the checkpoint stores block-quantized
// (GGUF) or in fp8 stays so: `weight` then holds its raw bytes (uint8 [out, row_bytes]) and `weight_storage`
// its type;
// forward computes on it (kiln/ops/quantized_linear.h).
// With a LinearParallel, this rank holds its slice (kiln/nn/tensor_parallel.h) and forward returns what that
// sharding defines: a local slice of the output (Column), the full output (ColumnGathered, Row).
// in_features/out_features stay the full layer's. A quantized weight is not sharded (replicated layers only).
//
// LoRA adapters (PEFT's lora.Linear, diffusers' load_lora_weights): each adapter is a low-rank pair down (A,
// [rank, in_features]) and up (B, [out_features, rank]) with its scale (alpha / rank). The layer adds
// sum_i w_i * scale_i * B_i (A_i x) for its active adapters (w_i: set_adapters' weights) as ONE low-rank
// product beside the base weight, which stays as it is (memory-mapped, bfloat16 or GGUF blocks): lora_down
// holds the active A_i stacked, lora_up the B_i side by side with w_i * scale_i folded in. Both are runtime
// inputs of the module, so a compiled program takes them as inputs: new adapters or weights of the same total
// rank never recompile. Without active adapters (lora_down undefined) the forward is exactly the plain
// layer's. Under tensor parallelism A is split like the weight's input (Row) and B like its output (Column).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, LinearParallel parallel = {});
  ~Linear() override;
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  // The dtype the layer computes in: the weight's, or for a quantized weight the dtype it was loaded for.
  DType dtype() const;
  bool is_quantized() const { return weight_storage.is_quantized(); }
  Sharding sharding() const { return parallel_.sharding; }
  Tensor weight, bias;
  QuantizedStorage weight_storage;
  // The layer is a 1x1 convolution run on tokens (diffusers' Transformer2DModel proj_in / proj_out without
  // use_linear_projection): the checkpoint holds its weight as [out, in, 1, 1], and LoRA pairs for it may
  // come as a 1x1 convolution's ([rank, in, 1, 1] and [out, rank, 1, 1], PEFT's lora.Conv2d).
  void store_weight_as_pointwise_conv();
  bool is_pointwise_conv() const { return pointwise_conv_; }

  // ---- LoRA adapters (src/nn/linear_lora.cpp)
  // Adds adapter `name` (replacing one of that name): the whole layer's down [rank, in_features] and up
  // [out_features, rank] in any floating dtype (this rank keeps its slice); `scale` is alpha / rank. It is
  // inactive until set_active_adapters names it. Throws naming the shapes when they do not fit the layer.
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
  // rounded once. The weight becomes an owned copy in the compute dtype (a quantized one, GGUF or fp8, is
  // dequantized); the original is kept, untouched, for unfuse_adapters. No-op without active adapters.
  void fuse_adapters(double lora_scale);
  // The original weight (and its storage type) back, bit for bit; the adapters run unfused again.
  void unfuse_adapters();
  bool is_fused() const;
  // Drops every adapter. A fused weight stays fused (diffusers' unload_lora_weights after fuse_lora).
  void clear_adapters();
  // The combined low-rank pair the forward reads (undefined without active adapters or while fused).
  const Tensor& lora_down() const { return lora_down_; }
  const Tensor& lora_up() const { return lora_up_; }

 private:
  struct Adapters;
  // y plus the active adapters' low-rank product of x (y itself without them): a separate product and add
  // (GGUF-quantized and float16 weights).
  Tensor add_adapters(const Tensor& x, const Tensor& y) const;
  // x @ weight^T + b plus the active adapters' product: one linear_fused call carrying the low-rank pair
  // (the plain linear without adapters), so the adapters cost two thin products and no pass of their own.
  Tensor product(const Tensor& x, const Tensor& b) const;
  void rebuild_adapters();

  int64_t in_, out_;
  bool pointwise_conv_ = false;
  LinearParallel parallel_;
  Tensor lora_down_, lora_up_;
  std::shared_ptr<Adapters> adapters_;  // null until an adapter is added
};

// torch.nn.LayerNorm over the last dimension; affine=false (FLUX) has no parameters.
class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, double eps, bool affine = true, bool with_bias = true);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  Tensor weight, bias;

 private:
  double eps_;
};

// RMS norm over the last dimension with a weight [dim] (diffusers' RMSNorm, transformers' T5LayerNorm).
class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, double eps, bool affine = true, RmsNormStyle style = RmsNormStyle::Diffusers);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  Tensor weight;

 private:
  double eps_;
  RmsNormStyle style_;
};

// torch.nn.GroupNorm (affine).
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t channels, double eps);
  Tensor forward(const Tensor& x) const;
  int64_t num_groups() const { return groups_; }
  double eps() const { return eps_; }
  Tensor operator()(const Tensor& x) const { return forward(x); }
  Tensor weight, bias;

 private:
  int64_t groups_;
  double eps_;
};

// torch.nn.Conv2d with square kernels: weight [out, in, k, k], bias [out].
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride = 1, int64_t padding = 0,
         bool bias = true);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  Tensor weight, bias;

 private:
  int64_t stride_, padding_;
};

// torch.nn.Embedding: weight [num, dim].
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim);
  Tensor forward(const Tensor& ids) const;
  Tensor operator()(const Tensor& ids) const { return forward(ids); }
  Tensor weight;
};

}  // namespace kiln::nn
