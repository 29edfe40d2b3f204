// The JSON configs of a diffusers folder: model_index.json, each component's config.json (FLUX.1, SD3 and
// FLUX.2 transformers, CLIP and T5 text encoders, FLUX.2's Mistral 3 / Qwen3 text encoders, the VAE and
// FLUX.2's AutoencoderKLFlux2), scheduler_config.json and tokenizer_config.json. One
// input is offered to every reader; a config a reader accepts is then built into its model (which registers
// every parameter's shape and allocates nothing), so sizes that a config can blow up (2^40 layers, widths
// whose products overflow) must be refused by the reader.
#include "fuzz_support.h"
#include "kiln/io/component_config.h"
#include "kiln/io/json_config.h"
#include "kiln/io/model_index.h"
#include "kiln/models/autoencoder_kl.h"
#include "kiln/models/autoencoder_kl_flux2.h"
#include "kiln/models/clip_text_model.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/models/flux2_transformer.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/models/sd3_transformer.h"
#include "kiln/models/t5_encoder.h"
#include "kiln/schedulers/flow_match_euler.h"

using namespace kiln;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::make_runtime_deterministic();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile file("config.json");
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  file.assign(text);
  const std::string& path = file.path();

  fuzz::expect_clean([&] {
    const io::JsonConfig c = io::JsonConfig::parse(std::string(text), "config.json");
    for (const std::string& key : c.keys()) {
      c.type_of(key);
      c.dump(key);
      fuzz::expect_clean([&] { c.get<int64_t>(key); });
      fuzz::expect_clean([&] { c.get<std::vector<double>>(key); });
      fuzz::expect_clean([&] { c.object(key).keys(); });
    }
  });
  fuzz::expect_clean([&] {
    const io::ModelIndex index = io::load_model_index(path);
    for (const auto& component : index.components) index.find(component.name);
  });
  fuzz::expect_clean([&] { io::load_model_config(path); });
  fuzz::expect_clean([&] { io::load_scheduler_config(path); });
  fuzz::expect_clean([&] { io::load_tokenizer_config(path); });
  fuzz::expect_clean([&] {
    FlowMatchEulerDiscreteScheduler scheduler = FlowMatchEulerDiscreteScheduler::from_pretrained(path);
    scheduler.set_timesteps(4);
  });
  fuzz::expect_clean(
      [&] { models::FluxTransformer2DModel model(models::FluxTransformerConfig::from_file(path)); });
  fuzz::expect_clean(
      [&] { models::SD3Transformer2DModel model(models::SD3TransformerConfig::from_file(path)); });
  fuzz::expect_clean([&] { models::ClipTextModel model(models::ClipTextConfig::from_file(path)); });
  fuzz::expect_clean([&] { models::T5EncoderModel model(models::T5EncoderConfig::from_file(path)); });
  fuzz::expect_clean(
      [&] { models::Flux2Transformer2DModel model(models::Flux2TransformerConfig::from_file(path)); });
  fuzz::expect_clean([&] {
    // Every layer and the final norm: the most a config can make the text encoder build.
    models::DecoderTextEncoder model(models::DecoderTextEncoderConfig::from_file(path), -1, true);
  });
  fuzz::expect_clean([&] {
    const models::AutoencoderKLConfig config = models::AutoencoderKLConfig::from_file(path);
    if (config.flux2) {
      models::AutoencoderKLFlux2 model(config);
    } else {
      models::AutoencoderKL model(config);
    }
    config.scale_factor();
  });
  return 0;
}
