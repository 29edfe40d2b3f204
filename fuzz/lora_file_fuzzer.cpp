// A whole LoRA file (.safetensors) read for the tiny FLUX.1, SD3 and FLUX.2 [klein] pipelines of tests/data
// (their transformers and CLIP encoders built from the committed configs, weights not loaded): the layout's
// names, alphas, lora_adapter_metadata, shapes checked against the layers, fused layers split, downs padded.
// Whatever reads must fit its layer exactly, and is then added to it as an adapter and activated (the
// combined pair's slicing and scaling), once with ignore_mismatches and once without.
#include <map>
#include <memory>
#include <vector>

#include "fuzz_support.h"
#include "kiln/lora/lora_file.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/flux2_transformer.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/sd3_transformer.h"
#include "kiln/nn/layers.h"

using namespace kiln;

namespace {

struct Pipeline {
  lora::ModelFamily family;
  std::map<std::string, std::unique_ptr<nn::Module>> components;
  std::map<std::string, std::map<std::string, nn::Linear*>> layers;

  void index() {
    for (auto& [component, module] : components)
      for (const auto& [name, m] : module->named_modules())
        if (auto* l = dynamic_cast<nn::Linear*>(m)) layers[component][name] = l;
  }
  nn::Linear* find(const std::string& component, const std::string& module) const {
    const auto c = layers.find(component);
    if (c == layers.end()) return nullptr;
    for (const std::string& name : {module, "text_model." + module})
      if (const auto it = c->second.find(name); it != c->second.end()) return it->second;
    return nullptr;
  }
};

std::unique_ptr<nn::Module> clip(const std::string& folder) {
  return std::make_unique<models::ClipTextModel>(
      models::ClipTextConfig::from_file(fuzz::source_path("tests/data/models/" + folder + "/config.json")));
}

std::vector<Pipeline>& pipelines() {
  static std::vector<Pipeline> all = [] {
    std::vector<Pipeline> p(3);
    const std::string data = "tests/data/models/";
    p[0].family = lora::ModelFamily::Flux1;
    p[0].components["transformer"] =
        std::make_unique<models::FluxTransformer2DModel>(models::FluxTransformerConfig::from_file(
            fuzz::source_path(data + "flux-tiny-dev/transformer/config.json")));
    p[0].components["text_encoder"] = clip("flux-tiny-dev/text_encoder");
    p[1].family = lora::ModelFamily::SD3;
    p[1].components["transformer"] =
        std::make_unique<models::SD3Transformer2DModel>(models::SD3TransformerConfig::from_file(
            fuzz::source_path(data + "sd3-tiny-medium/transformer/config.json")));
    p[1].components["text_encoder"] = clip("sd3-tiny-medium/text_encoder");
    p[1].components["text_encoder_2"] = clip("sd3-tiny-medium/text_encoder_2");
    p[2].family = lora::ModelFamily::Flux2;
    p[2].components["transformer"] =
        std::make_unique<models::Flux2Transformer2DModel>(models::Flux2TransformerConfig::from_file(
            fuzz::source_path(data + "flux2-tiny-klein-full/transformer/config.json")));
    for (Pipeline& pipe : p) pipe.index();
    return p;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::make_runtime_deterministic();
  pipelines();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile file("lora.safetensors");
  file.assign({reinterpret_cast<const char*>(data), size});
  for (Pipeline& pipe : pipelines()) {
    const auto find = [&](const std::string& c, const std::string& m) { return pipe.find(c, m); };
    for (bool ignore : {false, true}) {
      fuzz::expect_clean([&] {
        const lora::LoraContents contents = lora::read_lora_file(file.path(), pipe.family, find, ignore);
        for (const lora::LayerAdapter& l : contents.layers) {
          fuzz::require(l.layer != nullptr && l.down.dim() == 2 && l.up.dim() == 2,
                        "a layer adapter without its pair");
          fuzz::require(l.down.size(1) == l.layer->in_features() && l.up.size(0) == l.layer->out_features() &&
                            l.down.size(0) == l.up.size(1),
                        "an adapter that does not fit its layer");
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
