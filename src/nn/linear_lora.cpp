// nn::Linear's part of its LoRA adapters (kiln/nn/lora_layer.h): the pairs it takes (a tensor-parallel rank's
// slices), the forward's low-rank product, and merging into a weight that may be quantized.
#include <optional>

#include "kiln/nn/layers.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/fused.h"
#include "kiln/ops/layout.h"
#include "kiln/ops/linalg.h"

namespace kiln::nn {

Linear::~Linear() = default;

namespace {

// This rank's pieces of `t` along `dim` under `shard`, concatenated (the whole tensor without parallelism).
Tensor rank_slice(const Tensor& t, int dim, const std::optional<ParameterShard>& shard) {
  if (!shard) return t;
  std::vector<Tensor> pieces;
  for (const auto& [start, end] : shard->ranges()) pieces.push_back(t.narrow(dim, start, end - start));
  return pieces.size() == 1 ? pieces.front() : concat(pieces, dim);
}

}  // namespace

std::pair<Tensor, Tensor> Linear::adapter_pair(const std::string& name, const Tensor& down,
                                               const Tensor& up) const {
  KILN_CHECK(down.dim() == 2 && up.dim() == 2,
             "Linear.add_adapter '" << name << "': down and up must be 2-d, got " << shape_str(down.shape())
                                    << " and " << shape_str(up.shape()));
  const int64_t rank = down.size(0);
  KILN_CHECK(rank > 0 && down.size(1) == in_ && up.size(0) == out_ && up.size(1) == rank,
             "Linear.add_adapter '" << name << "': a layer of " << in_ << " -> " << out_
                                    << " features takes down [rank, " << in_ << "] and up [" << out_
                                    << ", rank], got down " << shape_str(down.shape()) << " and up "
                                    << shape_str(up.shape()));
  std::optional<ParameterShard> rows, columns;
  switch (parallel_.sharding) {
    case Sharding::Replicated:
      break;
    case Sharding::Column:
    case Sharding::ColumnGathered:
      rows = ParameterShard{0, parallel_.blocks.empty() ? std::vector<int64_t>{out_} : parallel_.blocks,
                            parallel_.tp};
      break;
    case Sharding::Row:
      columns = ParameterShard{1, parallel_.blocks.empty() ? std::vector<int64_t>{in_} : parallel_.blocks,
                               parallel_.tp};
      break;
  }
  return {rank_slice(down, 1, columns), rank_slice(up, 0, rows)};
}

Tensor Linear::add_adapters(const Tensor& x, const Tensor& y) const {
  if (!lora_down_.defined()) return y;
  return add(y, linear(linear(x, lora_down_), lora_up_));
}

Tensor Linear::product(const Tensor& x, const Tensor& b) const {
  // float16 has no fused low-rank product: the separate one.
  if (!lora_down_.defined() || weight.dtype() == float16) return add_adapters(x, linear(x, weight, b));
  return linear_fused(x, weight, b, {.low_rank_down = lora_down_, .low_rank_up = lora_up_});
}

void Linear::merge_into_weight(const Tensor& delta) {
  const Tensor base = is_quantized()
                          ? quant::QuantizedTensor{weight, weight_storage.type, {out_, in_}}.dequantize()
                          : weight.to(float32);
  const DType compute = dtype();
  original_weight_ = weight;
  original_storage_ = weight_storage;
  weight = add(base, delta).to(compute).contiguous();
  weight_storage = QuantizedStorage{quant::StorageType::F32, compute};
}

void Linear::restore_weight() {
  weight = original_weight_.to(weight.device());
  weight_storage = original_storage_;
  original_weight_ = Tensor();
}

void Linear::drop_original_weight() {
  original_weight_ = Tensor();
}

}  // namespace kiln::nn
