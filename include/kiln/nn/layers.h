// The standard layers, with the parameter names torch uses ("weight", "bias"), so checkpoints load by name.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/nn/lora_layer.h"
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
// LoRA adapters (PEFT's lora.Linear, kiln/nn/lora_layer.h): pairs down [rank, in_features] and up
// [out_features, rank]; the active ones run inside the layer's product (linear_fused's low-rank pair). Under
// tensor parallelism A is split like the weight's input (Row) and B like its output (Column).
class Linear : public Module, public LoraLayer {
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

 private:
  // LoraLayer (src/nn/linear_lora.cpp)
  const char* lora_layer_kind() const override { return "Linear"; }
  std::pair<Tensor, Tensor> adapter_pair(const std::string& name, const Tensor& down,
                                         const Tensor& up) const override;
  DType adapter_dtype() const override { return dtype(); }
  Device adapter_device() const override { return weight.device(); }
  void merge_into_weight(const Tensor& delta) override;
  void restore_weight() override;
  void drop_original_weight() override;
  // y plus the active adapters' low-rank product of x (y itself without them): a separate product and add
  // (GGUF-quantized and float16 weights).
  Tensor add_adapters(const Tensor& x, const Tensor& y) const;
  // x @ weight^T + b plus the active adapters' product: one linear_fused call carrying the low-rank pair
  // (the plain linear without adapters), so the adapters cost two thin products and no pass of their own.
  Tensor product(const Tensor& x, const Tensor& b) const;

  int64_t in_, out_;
  bool pointwise_conv_ = false;
  LinearParallel parallel_;
  // The weight and its storage before fuse_adapters, restored as they were.
  Tensor original_weight_;
  QuantizedStorage original_storage_;
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
//
// LoRA adapters (PEFT's lora.Conv2d, kiln/nn/lora_layer.h; kohya's and LyCORIS' LoCon): pairs down [rank, in,
// k, k], a convolution with the layer's kernel, stride and padding, and up [out, rank, 1, 1], a 1x1
// convolution. The active ones run beside the base convolution: conv(x) + up(down(x)), w_i * scale_i folded
// into up; fused, the weight gains up @ down (up [out, rank] times down [rank, in * k * k]).
class Conv2d : public Module, public LoraLayer {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride = 1, int64_t padding = 0,
         bool bias = true);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  int64_t in_channels() const { return in_; }
  int64_t out_channels() const { return out_; }
  int64_t kernel() const { return kernel_; }
  Tensor weight, bias;

 private:
  // LoraLayer (src/nn/conv_lora.cpp)
  const char* lora_layer_kind() const override { return "Conv2d"; }
  std::pair<Tensor, Tensor> adapter_pair(const std::string& name, const Tensor& down,
                                         const Tensor& up) const override;
  DType adapter_dtype() const override { return weight.dtype(); }
  Device adapter_device() const override { return weight.device(); }
  void merge_into_weight(const Tensor& delta) override;
  void restore_weight() override;
  void drop_original_weight() override;

  int64_t in_, out_, kernel_, stride_, padding_;
  Tensor original_weight_;  // the weight before fuse_adapters, restored as it was
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
