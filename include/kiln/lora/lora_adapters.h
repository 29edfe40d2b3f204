// The LoRA adapters of one pipeline, with diffusers' semantics (LoraBaseMixin and PEFT's LoRA layers):
//   - load: each file becomes a named adapter on the layers it reaches (kiln/lora/lora_file.h), in the
//     components the pipeline class loads LoRA into; the adapter just loaded becomes the only active one, at
//     weight 1 (as diffusers' load_lora_weights leaves it);
//   - set_adapters(names, weights): the active adapters and their weights;
//   - fuse(lora_scale): in the chosen components (diffusers' default: FLUX.1 and FLUX.2 the transformer, SD3
//     the transformer and both text encoders) the active adapters' weights are multiplied by lora_scale and
//     their sum added into the base weights; the rest keep running unfused. The weights keep that factor
//     after unfuse, until set_adapters sets them again (PEFT's scale_layer, as diffusers does);
//   - unfuse: the base weights back, bit for bit;
//   - unload: every adapter dropped; fused weights stay fused (diffusers: fuse_lora then unload_lora_weights
//     bakes the LoRA in).
// While fused, load, set_adapters and delete are refused (unfuse first): what PEFT does then depends on the
// order of its layers' flags, and an error is clearer.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kiln/lora/lora_family.h"
#include "kiln/lora/lora_keys.h"

namespace kiln::nn {
class LoraLayer;
class Module;
}  // namespace kiln::nn

namespace kiln::lora {

struct LoraLoadOptions {
  // The adapter's name; empty: "default_<n>", n the number of adapters loaded so far (diffusers' names).
  std::string adapter_name;
  // Pairs that fit no layer of the pipeline (unknown names, missing layers, wrong shapes or ranks) are
  // skipped and listed in the report instead of failing the load.
  bool ignore_mismatches = false;
};

struct LoraLoadReport {
  std::string adapter_name;
  LoraFormat format = LoraFormat::Diffusers;
  std::map<std::string, int64_t> layers;                     // per component: the layers it reaches
  std::vector<std::pair<std::string, std::string>> skipped;  // (tensor or pair, why)
  // "adapter 'style': kohya (sd-scripts), transformer 31 layers, text_encoder 2 layers (3 tensors skipped)"
  std::string describe() const;
};

struct FuseLoraOptions {
  double lora_scale = 1.0;
  // The components whose adapters are fused; empty: the pipeline's diffusers default.
  std::vector<std::string> components;
};

class LoraAdapters {
 public:
  // `family`: what LoRA means for the pipeline (its family's descriptor); `components`: the pipeline's (name,
  // module), of which those the family loads LoRA into take adapters. `pipeline_class` names the pipeline in
  // messages.
  LoraAdapters(const LoraFamily& family, const std::string& pipeline_class,
               const std::vector<std::pair<std::string, nn::Module*>>& components);

  LoraLoadReport load(const std::string& path, const LoraLoadOptions& options);
  // Empty weights: 1 each; otherwise one per name. Unknown names throw, naming the loaded ones.
  void set_adapters(const std::vector<std::string>& names, const std::vector<double>& weights);
  void fuse(const FuseLoraOptions& options);
  void unfuse();
  void unload();
  void delete_adapters(const std::vector<std::string>& names);
  std::vector<std::string> active_adapters() const;
  // Per component, the adapters that reach it (diffusers' get_list_adapters).
  std::map<std::string, std::vector<std::string>> list_adapters() const;
  bool fused() const { return !fused_components_.empty(); }

 private:
  struct Adapter {
    std::string name;
    std::map<std::string, std::vector<nn::LoraLayer*>> layers;  // per component
  };
  // Every layer holding an adapter, per component (each once).
  std::map<std::string, std::vector<nn::LoraLayer*>> adapted_layers() const;
  void apply_active();
  void refuse_while_fused(const char* what) const;

  LoraFamily family_;
  std::string pipeline_class_;
  std::vector<std::pair<std::string, nn::Module*>> components_;
  std::vector<Adapter> adapters_;
  std::vector<std::pair<std::string, double>> active_;
  std::vector<std::string> fused_components_;
  int64_t loaded_ = 0;
};

}  // namespace kiln::lora
