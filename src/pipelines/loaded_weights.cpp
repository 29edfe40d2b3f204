#include "kiln/pipelines/loaded_weights.h"

#include <algorithm>

#include "kiln/core/shape.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/flux2_prompt_encoder.h"

namespace kiln {

namespace {

bool is_flux2(const std::string& pipeline_class) {
  return pipeline_class == "Flux2Pipeline" || pipeline_class == "Flux2KleinPipeline";
}

std::string joined(const std::vector<int64_t>& values) {
  std::string s;
  for (int64_t v : values) s += (s.empty() ? "" : ", ") + std::to_string(v);
  return s;
}

}  // namespace

LoadedWeights loaded_weights(const io::ModelSummary& pipeline, const io::ComponentSummary& component) {
  LoadedWeights out;
  out.tensors = component.weights.tensor_parameters;
  out.parameters = component.weights.parameters;
  if (!component.has_weights || !is_flux2(pipeline.class_name) || component.name != "text_encoder")
    return out;
  const auto config = models::DecoderTextEncoderConfig::from_file(component.path + "/config.json");
  const std::vector<int64_t> layers = Flux2PromptEncoder::default_layers(config.family);
  const std::string asked = "hidden states " + joined(layers);
  if (*std::max_element(layers.begin(), layers.end()) > config.num_hidden_layers) {
    out.note = "the pipeline's default " + asked + " need more than its " +
               std::to_string(config.num_hidden_layers) + " layers";
    return out;
  }
  const models::DecoderLayersNeeded need = models::decoder_layers_needed(config, layers, component.path);
  // The model the pipeline builds, unloaded: registering parameters allocates nothing.
  models::DecoderTextEncoder model(config, need.layers, need.final_norm);
  out.tensors.clear();
  out.parameters = 0;
  for (const auto& [name, shape] : model.parameter_shapes()) {
    out.tensors.emplace_back(name, shape_numel(shape));
    out.parameters += shape_numel(shape);
  }
  out.note = "Kiln reads the embedding and layers 0-" + std::to_string(need.layers - 1) + " of " +
             std::to_string(config.num_hidden_layers) + (need.final_norm ? " and the final norm" : "") +
             " (" + asked + ")";
  return out;
}

}  // namespace kiln
