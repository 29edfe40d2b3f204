// LoRA adapters on nn::Linear (kiln/nn/layers.h): the adapters a layer holds, the combined low-rank pair its
// forward reads, and fusing them into the weight and back.
#include <algorithm>
#include <optional>

#include "kiln/nn/layers.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/fused.h"
#include "kiln/ops/layout.h"
#include "kiln/ops/linalg.h"

namespace kiln::nn {

struct Linear::Adapters {
  struct Pair {
    Tensor down, up;  // this rank's A [rank, in_local] and B [out_local, rank], as given (any float dtype)
    double scale = 1.0;
  };
  std::vector<std::pair<std::string, Pair>> pairs;     // in the order added
  std::vector<std::pair<std::string, double>> active;  // adapters this layer holds, with their weights
  bool fused = false;
  Tensor original_weight;  // the weight before fusing, restored as it was
  QuantizedStorage original_storage;

  Pair* find(const std::string& name) {
    for (auto& [n, p] : pairs)
      if (n == name) return &p;
    return nullptr;
  }
};

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

void Linear::add_adapter(const std::string& name, const Tensor& down, const Tensor& up, double scale) {
  KILN_CHECK(!name.empty(), "Linear.add_adapter: the adapter needs a name");
  KILN_CHECK(down.defined() && up.defined() && down.dim() == 2 && up.dim() == 2,
             "Linear.add_adapter '" << name << "': down and up must be 2-d, got "
                                    << (down.defined() ? shape_str(down.shape()) : "none") << " and "
                                    << (up.defined() ? shape_str(up.shape()) : "none"));
  KILN_CHECK(is_floating(down.dtype()) && is_floating(up.dtype()),
             "Linear.add_adapter '" << name << "': down and up must be floating point, got "
                                    << dtype_name(down.dtype()) << " and " << dtype_name(up.dtype()));
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
  if (!adapters_) adapters_ = std::make_shared<Adapters>();
  Adapters::Pair pair{rank_slice(down, 1, columns), rank_slice(up, 0, rows), scale};
  if (Adapters::Pair* existing = adapters_->find(name))
    *existing = std::move(pair);
  else
    adapters_->pairs.emplace_back(name, std::move(pair));
  rebuild_adapters();
}

void Linear::delete_adapter(const std::string& name) {
  if (!adapters_) return;
  auto& pairs = adapters_->pairs;
  pairs.erase(std::remove_if(pairs.begin(), pairs.end(), [&](const auto& p) { return p.first == name; }),
              pairs.end());
  auto& active = adapters_->active;
  active.erase(std::remove_if(active.begin(), active.end(), [&](const auto& a) { return a.first == name; }),
               active.end());
  rebuild_adapters();
}

bool Linear::has_adapter(const std::string& name) const {
  return adapters_ && adapters_->find(name) != nullptr;
}

std::vector<std::string> Linear::adapter_names() const {
  std::vector<std::string> names;
  if (adapters_)
    for (const auto& [name, pair] : adapters_->pairs) names.push_back(name);
  return names;
}

void Linear::set_active_adapters(const std::vector<std::pair<std::string, double>>& weights) {
  KILN_CHECK(!is_fused(), "Linear.set_active_adapters: the adapters are fused into the weight; unfuse first");
  if (!adapters_) return;
  adapters_->active.clear();
  for (const auto& [name, weight] : weights)
    if (adapters_->find(name) != nullptr) adapters_->active.emplace_back(name, weight);
  rebuild_adapters();
}

void Linear::rebuild_adapters() {
  lora_down_ = Tensor();
  lora_up_ = Tensor();
  if (!adapters_ || adapters_->fused || adapters_->active.empty()) return;
  std::vector<Tensor> downs, ups;
  for (const auto& [name, weight] : adapters_->active) {
    const Adapters::Pair& pair = *adapters_->find(name);
    downs.push_back(pair.down.to(float32));
    // The weight and alpha / rank are folded into B, in float32, before the one rounding to the layer's
    // dtype.
    ups.push_back(mul(pair.up.to(float32), weight * pair.scale));
  }
  const DType compute = dtype();
  // The adapters' files are read on the host; the pair runs beside the weight, wherever it is.
  lora_down_ =
      (downs.size() == 1 ? downs.front() : concat(downs, 0)).to(compute).contiguous().to(weight.device());
  lora_up_ = (ups.size() == 1 ? ups.front() : concat(ups, 1)).to(compute).contiguous().to(weight.device());
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

void Linear::fuse_adapters(double lora_scale) {
  KILN_CHECK(!is_fused(), "Linear.fuse_adapters: the adapters are already fused; unfuse first");
  if (!adapters_ || adapters_->active.empty()) return;
  for (auto& [name, weight] : adapters_->active) weight *= lora_scale;
  // sum_i w_i s_i B_i A_i in float32: the combined pair before its rounding.
  std::vector<Tensor> downs, ups;
  for (const auto& [name, weight] : adapters_->active) {
    const Adapters::Pair& pair = *adapters_->find(name);
    downs.push_back(pair.down.to(float32));
    ups.push_back(mul(pair.up.to(float32), weight * pair.scale));
  }
  const Tensor delta = matmul(concat(ups, 1), concat(downs, 0)).to(weight.device());
  const DType compute = dtype();
  const Tensor base = is_quantized()
                          ? quant::QuantizedTensor{weight, weight_storage.type, {out_, in_}}.dequantize()
                          : weight.to(float32);
  adapters_->original_weight = weight;
  adapters_->original_storage = weight_storage;
  weight = add(base, delta).to(compute).contiguous();
  weight_storage = QuantizedStorage{quant::StorageType::F32, compute};
  adapters_->fused = true;
  rebuild_adapters();
}

void Linear::unfuse_adapters() {
  if (!is_fused()) return;
  // The pipeline may have moved since fusing (pipe.to): the original goes where the fused weight is.
  weight = adapters_->original_weight.to(weight.device());
  weight_storage = adapters_->original_storage;
  adapters_->original_weight = Tensor();
  adapters_->fused = false;
  rebuild_adapters();
}

bool Linear::is_fused() const {
  return adapters_ && adapters_->fused;
}

void Linear::clear_adapters() {
  if (!adapters_) return;
  if (adapters_->fused) {
    // The merged weight stays; without adapters there is nothing to unfuse.
    adapters_->original_weight = Tensor();
  }
  adapters_.reset();
  rebuild_adapters();
}

}  // namespace kiln::nn
