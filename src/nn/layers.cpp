#include "kiln/nn/layers.h"

#include "kiln/ops/collective.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/quantized_linear.h"

namespace kiln::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias, LinearParallel parallel)
    : in_(in_features), out_(out_features), parallel_(std::move(parallel)) {
  if (!parallel_.tp.enabled()) parallel_.sharding = Sharding::Replicated;
  register_runtime_input(&lora_down_);
  register_runtime_input(&lora_up_);
  switch (parallel_.sharding) {
    case Sharding::Replicated:
      register_quantizable_parameter("weight", &weight, {out_features, in_features}, &weight_storage);
      if (with_bias) register_parameter("bias", &bias, {out_features});
      break;
    case Sharding::Column:
    case Sharding::ColumnGathered: {
      KILN_CHECK(parallel_.sharding == Sharding::Column || parallel_.blocks.empty(),
                 "Linear: a gathered column-parallel layer cannot be packed (the gather would interleave "
                 "its blocks)");
      const ParameterShard rows{
          0, parallel_.blocks.empty() ? std::vector<int64_t>{out_features} : parallel_.blocks, parallel_.tp};
      register_sharded_parameter("weight", &weight, {out_features, in_features}, rows);
      if (with_bias) register_sharded_parameter("bias", &bias, {out_features}, rows);
      break;
    }
    case Sharding::Row: {
      const ParameterShard columns{
          1, parallel_.blocks.empty() ? std::vector<int64_t>{in_features} : parallel_.blocks, parallel_.tp};
      register_sharded_parameter("weight", &weight, {out_features, in_features}, columns);
      if (with_bias) register_parameter("bias", &bias, {out_features});
      break;
    }
  }
}

Tensor Linear::forward(const Tensor& x) const {
  switch (parallel_.sharding) {
    case Sharding::Replicated:
      if (is_quantized())
        return add_adapters(
            x, linear(x, quant::QuantizedTensor{weight, weight_storage.type, {out_, in_}}, bias));
      return product(x, bias);
    case Sharding::Column:
      return product(x, bias);
    case Sharding::ColumnGathered:
      return all_gather(product(x, bias), -1);
    case Sharding::Row:
      // Rank 0 alone adds the bias, so the sum over the ranks holds it once. Each rank's adapter product
      // reads its slice of x through its columns of A; B (A_local x_local) summed over the ranks is B (A x).
      return all_reduce_sum(product(x, parallel_.tp.rank == 0 ? bias : Tensor()));
  }
  KILN_FAIL("internal: unknown Linear sharding");
}

void Linear::store_weight_as_pointwise_conv() {
  KILN_CHECK(parallel_.sharding == Sharding::Replicated, "Linear: a 1x1 convolution's weight is not sharded");
  set_checkpoint_shape("weight", {out_, in_, 1, 1});
  pointwise_conv_ = true;
}

DType Linear::dtype() const {
  return is_quantized() ? weight_storage.compute_dtype : weight.dtype();
}

LayerNorm::LayerNorm(int64_t dim, double eps, bool affine, bool with_bias) : eps_(eps) {
  if (affine) {
    register_parameter("weight", &weight, {dim});
    if (with_bias) register_parameter("bias", &bias, {dim});
  }
}

Tensor LayerNorm::forward(const Tensor& x) const {
  return layer_norm(x, 1, weight, bias, eps_);
}

RMSNorm::RMSNorm(int64_t dim, double eps, bool affine, RmsNormStyle style) : eps_(eps), style_(style) {
  if (affine) register_parameter("weight", &weight, {dim});
}

Tensor RMSNorm::forward(const Tensor& x) const {
  return rms_norm(x, weight, eps_, style_);
}

GroupNorm::GroupNorm(int64_t num_groups, int64_t channels, double eps) : groups_(num_groups), eps_(eps) {
  KILN_CHECK(num_groups > 0 && channels % num_groups == 0,
             "GroupNorm: " << channels << " channels cannot be split into " << num_groups << " groups");
  register_parameter("weight", &weight, {channels});
  register_parameter("bias", &bias, {channels});
}

Tensor GroupNorm::forward(const Tensor& x) const {
  return group_norm(x, groups_, weight, bias, eps_);
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding,
               bool with_bias)
    : in_(in_channels), out_(out_channels), kernel_(kernel), stride_(stride), padding_(padding) {
  register_runtime_input(&lora_down_);
  register_runtime_input(&lora_up_);
  register_parameter("weight", &weight, {out_channels, in_channels, kernel, kernel});
  if (with_bias) register_parameter("bias", &bias, {out_channels});
}

Tensor Conv2d::forward(const Tensor& x) const {
  const Tensor y = conv2d(x, weight, bias, {stride_, stride_}, {padding_, padding_});
  if (!lora_down_.defined()) return y;
  // PEFT's lora.Conv2d: down is a convolution with the layer's kernel, stride and padding, up a 1x1 one.
  return add(y, conv2d(conv2d(x, lora_down_, {}, {stride_, stride_}, {padding_, padding_}), lora_up_));
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim) {
  register_parameter("weight", &weight, {num_embeddings, dim});
}

Tensor Embedding::forward(const Tensor& ids) const {
  return embedding(weight, ids);
}

}  // namespace kiln::nn
