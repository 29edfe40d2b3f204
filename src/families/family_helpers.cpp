#include "families/family_helpers.h"

#include <algorithm>
#include <filesystem>

#include "kiln/core/shape.h"

#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/t5_encoder.h"

namespace kiln {

std::unique_ptr<nn::Module> shared_unloaded_component(const std::string& class_name,
                                                      const std::string& folder) {
  using namespace models;
  const std::string config = folder + "/config.json";
  if (class_name == "AutoencoderKL")
    return std::make_unique<AutoencoderKL>(AutoencoderKLConfig::from_file(config));
  if (class_name == "CLIPTextModel" || class_name == "CLIPTextModelWithProjection")
    return std::make_unique<ClipTextModel>(ClipTextConfig::from_file(config));
  if (class_name == "T5EncoderModel")
    return std::make_unique<T5EncoderModel>(T5EncoderConfig::from_file(config));
  // Every layer: the names of the layers a pipeline reads are the same in the model it builds with fewer.
  if (class_name == "Mistral3ForConditionalGeneration" || class_name == "Qwen3ForCausalLM" ||
      class_name == "Qwen3Model")
    return std::make_unique<DecoderTextEncoder>(DecoderTextEncoderConfig::from_file(config), -1, true);
  return nullptr;
}

std::optional<LoadedWeights> decoder_text_encoder_weights(
    const io::ComponentSummary& component,
    const std::function<std::vector<int64_t>(const models::DecoderTextEncoderConfig&)>& indices_of) {
  if (!component.has_weights || component.name != "text_encoder") return std::nullopt;
  LoadedWeights out;
  out.tensors = component.weights.tensor_parameters;
  out.parameters = component.weights.parameters;
  const auto config = models::DecoderTextEncoderConfig::from_file(component.path + "/config.json");
  const std::vector<int64_t> layers = indices_of(config);
  std::string asked = "hidden states";
  for (size_t i = 0; i < layers.size(); ++i) asked += (i ? ", " : " ") + std::to_string(layers[i]);
  if (layers.empty() || *std::max_element(layers.begin(), layers.end()) > config.num_hidden_layers) {
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

std::string single_file_transformer_config(const std::string& folder, const PipelineLoadOptions& options,
                                           const char* pipeline_class) {
  KILN_CHECK(
      options.parallel_config.count("transformer") == 0 && options.tensor_parallel == 1,
      pipeline_class << ": a single-file transformer cannot be split across ranks yet; load it without "
                        "tensor parallelism or from a diffusers folder");
  const std::filesystem::path config = std::filesystem::path(folder) / "transformer" / "config.json";
  return std::filesystem::is_regular_file(config) ? config.string() : "";
}

}  // namespace kiln
