// A whole LoRA file (.safetensors) read for a tiny pipeline of every registered family that takes LoRA (the
// first folder of tests/data/models of the family, its LoRA components built from the committed configs by
// the family, weights not loaded): the layout's names, alphas, lora_adapter_metadata, shapes checked against
// the layers, fused layers split, downs padded. Whatever reads must fit its layer exactly, and is then added
// to it as an adapter and activated (the combined pair's slicing and scaling), once with ignore_mismatches
// and once without.
#include <map>
#include <memory>
#include <vector>

#include <algorithm>
#include <filesystem>
#include "fuzz_support.h"

#include "kiln/io/model_index.h"
#include "kiln/lora/lora_file.h"
#include "kiln/nn/layers.h"
#include "kiln/pipelines/pipeline_registry.h"

using namespace kiln;

namespace {

struct Pipeline {
  const lora::LoraFamily* family = nullptr;
  std::map<std::string, std::unique_ptr<nn::Module>> components;
  std::map<std::string, std::map<std::string, nn::LoraLayer*>> layers;

  void index() {
    for (auto& [component, module] : components)
      for (const auto& [name, m] : module->named_modules())
        if (auto* l = dynamic_cast<nn::LoraLayer*>(m)) layers[component][name] = l;
  }
  nn::LoraLayer* find(const std::string& component, const std::string& module) const {
    const auto c = layers.find(component);
    if (c == layers.end()) return nullptr;
    for (const std::string& name : {module, "text_model." + module})
      if (const auto it = c->second.find(name); it != c->second.end()) return it->second;
    return nullptr;
  }
};

// The first folder of tests/data/models (by name) of `family` that has every component it loads LoRA into.
std::optional<Pipeline> tiny_pipeline(const Family& family) {
  namespace fs = std::filesystem;
  std::vector<fs::path> folders;
  for (const auto& entry : fs::directory_iterator(fuzz::source_path("tests/data/models")))
    if (fs::is_regular_file(entry.path() / "model_index.json")) folders.push_back(entry.path());
  std::sort(folders.begin(), folders.end());
  for (const fs::path& folder : folders) {
    const io::ModelIndex index = io::load_model_index((folder / "model_index.json").string());
    const PipelineClass* c = find_pipeline_class(index.class_name);
    if (c == nullptr || c->family != &family) continue;
    Pipeline pipe;
    pipe.family = &*family.lora;
    for (const std::string& name : family.lora->components) {
      const io::PipelineComponent* component = index.find(name);
      if (component == nullptr || !component->present()) break;
      auto model = family.unloaded_component(component->class_name, (folder / name).string());
      if (model) pipe.components[name] = std::move(model);
    }
    if (pipe.components.size() != family.lora->components.size()) continue;
    pipe.index();
    return pipe;
  }
  return std::nullopt;
}

std::vector<Pipeline>& tiny_pipelines() {
  static std::vector<Pipeline> all = [] {
    std::vector<Pipeline> p;
    for (const Family& family : families())
      if (family.lora && family.unloaded_component)
        if (std::optional<Pipeline> pipe = tiny_pipeline(family)) p.push_back(std::move(*pipe));
    return p;
  }();
  return all;
}

// A Linear's down [rank, in] and up [out, rank]; a convolution's down [rank, in, k, k] and up [out, rank, 1,
// 1].
bool fits(const lora::LayerAdapter& l) {
  const Shape& d = l.down.shape();
  const Shape& u = l.up.shape();
  if (const auto* linear = dynamic_cast<const nn::Linear*>(l.layer))
    return d.size() == 2 && u.size() == 2 && d[1] == linear->in_features() &&
           u[0] == linear->out_features() && d[0] == u[1];
  if (const auto* conv = dynamic_cast<const nn::Conv2d*>(l.layer))
    return d.size() == 4 && u.size() == 4 && d[0] == u[1] && d[1] == conv->in_channels() &&
           d[2] == conv->kernel() && d[3] == conv->kernel() && u[0] == conv->out_channels() && u[2] == 1 &&
           u[3] == 1;
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::make_runtime_deterministic();
  tiny_pipelines();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile file("lora.safetensors");
  file.assign({reinterpret_cast<const char*>(data), size});
  for (Pipeline& pipe : tiny_pipelines()) {
    const auto find = [&](const std::string& c, const std::string& m) { return pipe.find(c, m); };
    for (bool ignore : {false, true}) {
      fuzz::expect_clean([&] {
        const lora::LoraContents contents = lora::read_lora_file(file.path(), *pipe.family, find, ignore);
        for (const lora::LayerAdapter& l : contents.layers) {
          fuzz::require(l.layer != nullptr && l.down.defined() && l.up.defined(),
                        "a layer adapter without its pair");
          fuzz::require(fits(l), "an adapter that does not fit its layer");
          l.layer->add_adapter("fuzz", l.down, l.up, l.scale);
          l.layer->set_active_adapters({{"fuzz", 0.5}});
          const std::vector<float> up = l.layer->lora_up().to_vector<float>();
          fuzz::touch(up.data(), up.size() * sizeof(float));
          l.layer->clear_adapters();
        }
      });
    }
  }
  return 0;
}
