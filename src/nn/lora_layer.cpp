// The LoRA adapters of a layer (kiln/nn/lora_layer.h): which it holds, which are active and at what weights,
// the combined pair its forward reads, and the fused state. The layers' own parts are in linear_lora.cpp and
// conv_lora.cpp.
#include "kiln/nn/lora_layer.h"

#include <algorithm>

#include "kiln/core/error.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "kiln/ops/linalg.h"

namespace kiln::nn {

struct LoraLayer::Adapters {
  struct Pair {
    Tensor down, up;  // as the layer keeps them (any float dtype)
    double scale = 1.0;
  };
  std::vector<std::pair<std::string, Pair>> pairs;     // in the order added
  std::vector<std::pair<std::string, double>> active;  // adapters this layer holds, with their weights
  bool fused = false;

  Pair* find(const std::string& name) {
    for (auto& [n, p] : pairs)
      if (n == name) return &p;
    return nullptr;
  }

  // The active adapters as one pair in float32: the A_i stacked along the rank (dim 0), the B_i side by side
  // (dim 1) with w_i * scale_i folded in.
  std::pair<Tensor, Tensor> combined() {
    std::vector<Tensor> downs, ups;
    for (const auto& [name, weight] : active) {
      const Pair& pair = *find(name);
      downs.push_back(pair.down.to(float32));
      ups.push_back(mul(pair.up.to(float32), weight * pair.scale));
    }
    return {downs.size() == 1 ? downs.front() : concat(downs, 0),
            ups.size() == 1 ? ups.front() : concat(ups, 1)};
  }
};

LoraLayer::LoraLayer() = default;
LoraLayer::~LoraLayer() = default;

void LoraLayer::add_adapter(const std::string& name, const Tensor& down, const Tensor& up, double scale) {
  KILN_CHECK(!name.empty(), lora_layer_kind() << ".add_adapter: the adapter needs a name");
  KILN_CHECK(down.defined() && up.defined(),
             lora_layer_kind() << ".add_adapter '" << name << "': down and up must both be given");
  KILN_CHECK(is_floating(down.dtype()) && is_floating(up.dtype()),
             lora_layer_kind() << ".add_adapter '" << name << "': down and up must be floating point, got "
                               << dtype_name(down.dtype()) << " and " << dtype_name(up.dtype()));
  auto [local_down, local_up] = adapter_pair(name, down, up);
  if (!adapters_) adapters_ = std::make_unique<Adapters>();
  Adapters::Pair pair{std::move(local_down), std::move(local_up), scale};
  if (Adapters::Pair* existing = adapters_->find(name))
    *existing = std::move(pair);
  else
    adapters_->pairs.emplace_back(name, std::move(pair));
  rebuild_adapters();
}

void LoraLayer::delete_adapter(const std::string& name) {
  if (!adapters_) return;
  auto& pairs = adapters_->pairs;
  pairs.erase(std::remove_if(pairs.begin(), pairs.end(), [&](const auto& p) { return p.first == name; }),
              pairs.end());
  auto& active = adapters_->active;
  active.erase(std::remove_if(active.begin(), active.end(), [&](const auto& a) { return a.first == name; }),
               active.end());
  rebuild_adapters();
}

bool LoraLayer::has_adapter(const std::string& name) const {
  return adapters_ && adapters_->find(name) != nullptr;
}

std::vector<std::string> LoraLayer::adapter_names() const {
  std::vector<std::string> names;
  if (adapters_)
    for (const auto& [name, pair] : adapters_->pairs) names.push_back(name);
  return names;
}

void LoraLayer::set_active_adapters(const std::vector<std::pair<std::string, double>>& weights) {
  KILN_CHECK(
      !is_fused(),
      lora_layer_kind() << ".set_active_adapters: the adapters are fused into the weight; unfuse first");
  if (!adapters_) return;
  adapters_->active.clear();
  for (const auto& [name, weight] : weights)
    if (adapters_->find(name) != nullptr) adapters_->active.emplace_back(name, weight);
  rebuild_adapters();
}

void LoraLayer::rebuild_adapters() {
  lora_down_ = Tensor();
  lora_up_ = Tensor();
  if (!adapters_ || adapters_->fused || adapters_->active.empty()) return;
  const auto [down, up] = adapters_->combined();
  // The adapters' files are read on the host; the pair runs beside the weight, wherever it is.
  lora_down_ = down.to(adapter_dtype()).contiguous().to(adapter_device());
  lora_up_ = up.to(adapter_dtype()).contiguous().to(adapter_device());
}

void LoraLayer::fuse_adapters(double lora_scale) {
  KILN_CHECK(!is_fused(), lora_layer_kind()
                              << ".fuse_adapters: the adapters are already fused; unfuse first");
  if (!adapters_ || adapters_->active.empty()) return;
  for (auto& [name, weight] : adapters_->active) weight *= lora_scale;
  // sum_i w_i s_i B_i A_i in float32: the combined pair before its rounding, as [out, rank] @ [rank, rest].
  const auto [down, up] = adapters_->combined();
  const int64_t rank = down.size(0);
  const Tensor delta =
      matmul(up.reshape({up.size(0), rank}), down.reshape({rank, down.numel() / rank})).to(adapter_device());
  merge_into_weight(delta);
  adapters_->fused = true;
  rebuild_adapters();
}

void LoraLayer::unfuse_adapters() {
  if (!is_fused()) return;
  restore_weight();
  adapters_->fused = false;
  rebuild_adapters();
}

bool LoraLayer::is_fused() const {
  return adapters_ && adapters_->fused;
}

void LoraLayer::clear_adapters() {
  if (!adapters_) return;
  // The merged weight stays; without adapters there is nothing to unfuse.
  if (adapters_->fused) drop_original_weight();
  adapters_.reset();
  rebuild_adapters();
}

}  // namespace kiln::nn
