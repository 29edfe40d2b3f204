#include "kiln/pipelines/component_blocks.h"

#include <memory>

#include "kiln/models/autoencoder_kl_flux2.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/flux2_transformer.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/sd3_transformer.h"
#include "kiln/models/t5_encoder.h"

namespace kiln {

namespace {

std::unique_ptr<nn::Module> unloaded_model(const std::string& class_name, const std::string& folder) {
  using namespace models;
  const std::string config = folder + "/config.json";
  if (class_name == "FluxTransformer2DModel")
    return std::make_unique<FluxTransformer2DModel>(FluxTransformerConfig::from_file(folder));
  if (class_name == "Flux2Transformer2DModel")
    return std::make_unique<Flux2Transformer2DModel>(Flux2TransformerConfig::from_file(folder));
  if (class_name == "SD3Transformer2DModel")
    return std::make_unique<SD3Transformer2DModel>(SD3TransformerConfig::from_file(folder));
  if (class_name == "AutoencoderKL")
    return std::make_unique<AutoencoderKL>(AutoencoderKLConfig::from_file(config));
  if (class_name == "AutoencoderKLFlux2")
    return std::make_unique<AutoencoderKLFlux2>(AutoencoderKLConfig::from_file(config));
  if (class_name == "CLIPTextModel" || class_name == "CLIPTextModelWithProjection")
    return std::make_unique<ClipTextModel>(ClipTextConfig::from_file(config));
  if (class_name == "T5EncoderModel")
    return std::make_unique<T5EncoderModel>(T5EncoderConfig::from_file(config));
  // Every layer: the names of the layers the pipeline reads are the same in the model it builds with fewer.
  if (class_name == "Mistral3ForConditionalGeneration" || class_name == "Qwen3ForCausalLM")
    return std::make_unique<DecoderTextEncoder>(DecoderTextEncoderConfig::from_file(config), -1, true);
  return nullptr;
}

}  // namespace

std::map<std::string, nn::BlockPosition> component_block_positions(const io::ComponentSummary& component) {
  if (component.path.empty()) return {};
  const std::unique_ptr<nn::Module> model = unloaded_model(component.class_name, component.path);
  return model ? nn::block_positions_by_name(*model) : std::map<std::string, nn::BlockPosition>{};
}

}  // namespace kiln
