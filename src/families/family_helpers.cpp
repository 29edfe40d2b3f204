#include "families/family_helpers.h"

#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/t5_encoder.h"

namespace kiln {

std::unique_ptr<nn::Module> shared_unloaded_component(const std::string& class_name, const std::string& folder) {
  using namespace models;
  const std::string config = folder + "/config.json";
  if (class_name == "AutoencoderKL") return std::make_unique<AutoencoderKL>(AutoencoderKLConfig::from_file(config));
  if (class_name == "CLIPTextModel" || class_name == "CLIPTextModelWithProjection")
    return std::make_unique<ClipTextModel>(ClipTextConfig::from_file(config));
  if (class_name == "T5EncoderModel") return std::make_unique<T5EncoderModel>(T5EncoderConfig::from_file(config));
  // Every layer: the names of the layers a pipeline reads are the same in the model it builds with fewer.
  if (class_name == "Mistral3ForConditionalGeneration" || class_name == "Qwen3ForCausalLM" ||
      class_name == "Qwen3Model")
    return std::make_unique<DecoderTextEncoder>(DecoderTextEncoderConfig::from_file(config), -1, true);
  return nullptr;
}

}  // namespace kiln
