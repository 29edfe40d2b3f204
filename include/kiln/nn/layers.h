// The standard layers, with the parameter names torch uses ("weight", "bias"), so checkpoints load by name.
#pragma once

#include <array>

#include "kiln/nn/module.h"
#include "kiln/nn/tensor_parallel.h"
#include "kiln/ops/nn.h"

namespace kiln::nn {

// torch.nn.Linear: weight [out, in], optional bias [out]. A weight that the checkpoint stores block-quantized
// (GGUF) stays so: `weight` then holds its raw blocks (uint8 [out, row_bytes]) and `weight_storage` its type;
// forward computes on it (kiln/ops/quantized_linear.h).
// With a LinearParallel, this rank holds its slice (kiln/nn/tensor_parallel.h) and forward returns what that
// sharding defines: a local slice of the output (Column), the full output (ColumnGathered, Row).
// in_features/out_features stay the full layer's. A quantized weight is not sharded (replicated layers only).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, LinearParallel parallel = {});
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

 private:
  int64_t in_, out_;
  LinearParallel parallel_;
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
