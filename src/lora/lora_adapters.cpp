#include "kiln/lora/lora_adapters.h"

#include <algorithm>
#include <set>

#include "kiln/core/error.h"
#include "kiln/core/log.h"
#include "kiln/lora/lora_file.h"
#include "kiln/nn/layers.h"

namespace kiln::lora {

namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}

}  // namespace

std::string LoraLoadReport::describe() const {
  std::string s = "adapter '" + adapter_name + "': " + format_name(format);
  for (const auto& [component, n] : layers)
    s += ", " + component + " " + std::to_string(n) + (n == 1 ? " layer" : " layers");
  if (layers.empty()) s += ", no layers";
  if (!skipped.empty()) s += " (" + std::to_string(skipped.size()) + " skipped)";
  return s;
}

LoraAdapters::LoraAdapters(const LoraFamily& family, const std::string& pipeline_class,
                           const std::vector<std::pair<std::string, nn::Module*>>& components)
    : family_(family), pipeline_class_(pipeline_class) {
  for (const auto& [name, module] : components)
    if (module != nullptr &&
        std::find(family_.components.begin(), family_.components.end(), name) != family_.components.end())
      components_.emplace_back(name, module);
}

void LoraAdapters::refuse_while_fused(const char* what) const {
  KILN_CHECK(!fused(), pipeline_class_ << "." << what << ": the LoRA adapters are fused into "
                                       << joined(fused_components_) << "; call unfuse_lora() first");
}

std::map<std::string, std::vector<nn::LoraLayer*>> LoraAdapters::adapted_layers() const {
  std::map<std::string, std::vector<nn::LoraLayer*>> out;
  for (const Adapter& a : adapters_)
    for (const auto& [component, layers] : a.layers) {
      auto& list = out[component];
      for (nn::LoraLayer* l : layers)
        if (std::find(list.begin(), list.end(), l) == list.end()) list.push_back(l);
    }
  return out;
}

void LoraAdapters::apply_active() {
  for (const auto& [component, layers] : adapted_layers())
    for (nn::LoraLayer* layer : layers) layer->set_active_adapters(active_);
}

LoraLoadReport LoraAdapters::load(const std::string& path, const LoraLoadOptions& options) {
  refuse_while_fused("load_lora_weights");
  LoraLoadReport report;
  report.adapter_name =
      options.adapter_name.empty() ? "default_" + std::to_string(loaded_) : options.adapter_name;
  KILN_CHECK(std::none_of(adapters_.begin(), adapters_.end(),
                          [&](const Adapter& a) { return a.name == report.adapter_name; }),
             pipeline_class_ << ".load_lora_weights: adapter name '" << report.adapter_name
                             << "' is already in use; choose another adapter_name");
  // Each component's layers that take LoRA (Linears, convolutions) by their diffusers module names.
  // transformers' CLIPTextModel (5.x) names its layers without the text_model. prefix that
  // CLIPTextModelWithProjection and older files keep: both are found.
  std::map<std::string, std::map<std::string, nn::LoraLayer*>> by_name;
  for (const auto& [component, module] : components_)
    for (const auto& [name, m] : module->named_modules())
      if (auto* layer = dynamic_cast<nn::LoraLayer*>(m)) by_name[component][name] = layer;
  const LayerLookup find = [&](const std::string& component, const std::string& module) -> nn::LoraLayer* {
    const auto c = by_name.find(component);
    if (c == by_name.end()) return nullptr;
    for (const std::string& name : {module, "text_model." + module}) {
      if (name != module && !starts_with(component, "text_encoder")) break;
      if (const auto it = c->second.find(name); it != c->second.end()) return it->second;
    }
    return nullptr;
  };
  const LoraContents contents = read_lora_file(path, family_, find, options.ignore_mismatches);
  report.format = contents.format;
  report.skipped = contents.skipped;
  if (contents.layers.empty()) {
    warn(path + ": no layer of the " + pipeline_class_ + " takes this LoRA file; nothing was loaded");
    return report;
  }
  Adapter adapter{report.adapter_name, {}};
  try {
    for (const LayerAdapter& l : contents.layers) {
      l.layer->add_adapter(adapter.name, l.down, l.up, l.scale);
      adapter.layers[l.target.component].push_back(l.layer);
    }
  } catch (...) {
    for (const auto& [component, layers] : adapter.layers)
      for (nn::LoraLayer* layer : layers) layer->delete_adapter(adapter.name);
    throw;
  }
  for (const auto& [component, layers] : adapter.layers)
    report.layers[component] = static_cast<int64_t>(layers.size());
  adapters_.push_back(std::move(adapter));
  ++loaded_;
  active_ = {{report.adapter_name, 1.0}};
  apply_active();
  return report;
}

void LoraAdapters::set_adapters(const std::vector<std::string>& names, const std::vector<double>& weights) {
  refuse_while_fused("set_adapters");
  KILN_CHECK(weights.empty() || weights.size() == names.size(),
             pipeline_class_ << ".set_adapters: " << names.size() << " adapter name(s) but " << weights.size()
                             << " weight(s)");
  std::vector<std::string> loaded;
  for (const Adapter& a : adapters_) loaded.push_back(a.name);
  std::vector<std::pair<std::string, double>> active;
  for (size_t i = 0; i < names.size(); ++i) {
    KILN_CHECK(std::find(loaded.begin(), loaded.end(), names[i]) != loaded.end(),
               pipeline_class_ << ".set_adapters: no adapter named '" << names[i]
                               << "' (loaded: " << joined(loaded) << ")");
    active.emplace_back(names[i], weights.empty() ? 1.0 : weights[i]);
  }
  active_ = std::move(active);
  apply_active();
}

void LoraAdapters::fuse(const FuseLoraOptions& options) {
  refuse_while_fused("fuse_lora");
  const std::vector<std::string> components =
      options.components.empty() ? family_.fuse_components : options.components;
  for (const std::string& c : components)
    KILN_CHECK(std::find(family_.components.begin(), family_.components.end(), c) != family_.components.end(),
               pipeline_class_ << ".fuse_lora: '" << c << "' is not a component it loads LoRA into ("
                               << joined(family_.components) << ")");
  const auto layers = adapted_layers();
  for (const std::string& c : components) {
    const auto it = layers.find(c);
    if (it == layers.end()) continue;
    for (nn::LoraLayer* layer : it->second) layer->fuse_adapters(options.lora_scale);
    fused_components_.push_back(c);
  }
}

void LoraAdapters::unfuse() {
  for (const auto& [component, layers] : adapted_layers())
    for (nn::LoraLayer* layer : layers) layer->unfuse_adapters();
  fused_components_.clear();
}

void LoraAdapters::unload() {
  for (const auto& [component, layers] : adapted_layers())
    for (nn::LoraLayer* layer : layers) layer->clear_adapters();
  adapters_.clear();
  active_.clear();
  fused_components_.clear();
}

void LoraAdapters::delete_adapters(const std::vector<std::string>& names) {
  refuse_while_fused("delete_adapters");
  for (const std::string& name : names) {
    const auto it =
        std::find_if(adapters_.begin(), adapters_.end(), [&](const Adapter& a) { return a.name == name; });
    KILN_CHECK(it != adapters_.end(),
               pipeline_class_ << ".delete_adapters: no adapter named '" << name << "'");
    for (const auto& [component, layers] : it->layers)
      for (nn::LoraLayer* layer : layers) layer->delete_adapter(name);
    adapters_.erase(it);
    active_.erase(
        std::remove_if(active_.begin(), active_.end(), [&](const auto& a) { return a.first == name; }),
        active_.end());
  }
}

std::vector<std::string> LoraAdapters::active_adapters() const {
  std::vector<std::string> names;
  for (const auto& [name, weight] : active_) names.push_back(name);
  return names;
}

std::map<std::string, std::vector<std::string>> LoraAdapters::list_adapters() const {
  std::map<std::string, std::vector<std::string>> out;
  for (const Adapter& a : adapters_)
    for (const auto& [component, layers] : a.layers) out[component].push_back(a.name);
  return out;
}

}  // namespace kiln::lora
