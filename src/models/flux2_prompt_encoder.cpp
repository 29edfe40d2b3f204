#include "kiln/models/flux2_prompt_encoder.h"

#include <filesystem>

#include "kiln/core/error.h"
#include "kiln/io/model_index.h"
#include "kiln/io/model_ref.h"
#include "kiln/ops.h"
#include "kiln/tokenizers/chat_prompts.h"

namespace kiln {

std::vector<int64_t> Flux2PromptEncoder::default_layers(models::DecoderFamily family) {
  return family == models::DecoderFamily::Mistral ? std::vector<int64_t>{10, 20, 30}
                                                  : std::vector<int64_t>{9, 18, 27};
}

Flux2PromptEncoder Flux2PromptEncoder::from_pretrained(const std::string& model,
                                                       const Flux2PromptEncoderOptions& options) {
  const std::string folder = io::resolve_model(model).path;
  const std::string text_encoder = folder + "/text_encoder";
  KILN_CHECK(std::filesystem::is_directory(text_encoder),
             folder << ": no text_encoder/ folder (expected a FLUX.2 pipeline folder)");
  const auto config = models::DecoderTextEncoderConfig::from_file(text_encoder + "/config.json");
  if (std::filesystem::exists(folder + "/model_index.json")) {
    const io::ModelIndex index = io::load_model_index(folder);
    const bool klein = index.class_name.rfind("Flux2Klein", 0) == 0;
    KILN_CHECK(index.class_name == "Flux2Pipeline" || klein,
               index.path << ": pipeline \"" << index.class_name
                          << "\" is not FLUX.2 (expected Flux2Pipeline or Flux2KleinPipeline)");
    const auto expected = klein ? models::DecoderFamily::Qwen3 : models::DecoderFamily::Mistral;
    KILN_CHECK(config.family == expected, text_encoder << "/config.json: " << index.class_name
                                                       << " expects a " << (klein ? "Qwen3" : "Mistral 3")
                                                       << " text encoder");
  }
  return from_folders(text_encoder, folder + "/tokenizer", options);
}

Flux2PromptEncoder Flux2PromptEncoder::from_folders(const std::string& text_encoder,
                                                    const std::string& tokenizer,
                                                    const Flux2PromptEncoderOptions& options,
                                                    const std::function<void(const char*)>& on_loaded) {
  const auto config = models::DecoderTextEncoderConfig::from_file(text_encoder + "/config.json");
  Flux2PromptEncoder e;
  e.layers_ = options.text_encoder_out_layers.empty() ? default_layers(config.family)
                                                      : options.text_encoder_out_layers;
  e.tokenizer_ =
      std::make_unique<tokenizers::BpeTokenizer>(tokenizers::BpeTokenizer::from_directory(tokenizer));
  KILN_CHECK(e.tokenizer_->pad_id().has_value(), tokenizer << ": no pad token (FLUX.2 pads to max_length)");
  if (on_loaded) on_loaded("tokenizer");
  e.encoder_ = models::load_decoder_text_encoder(text_encoder, options.dtype, e.layers_, options.tp);
  if (on_loaded) on_loaded("text_encoder");
  return e;
}

int64_t Flux2PromptEncoder::embedding_dim() const {
  return static_cast<int64_t>(layers_.size()) * encoder_->config().hidden_size;
}

std::string Flux2PromptEncoder::chat_prompt(const std::string& prompt) const {
  if (family() == models::DecoderFamily::Mistral)
    return tokenizers::mistral_flux2_chat_prompt(prompt, tokenizer_->bos_token());
  return tokenizers::qwen3_chat_prompt(prompt);
}

std::pair<Tensor, Tensor> Flux2PromptEncoder::tokenize(const std::vector<std::string>& prompts,
                                                       int64_t max_sequence_length) const {
  KILN_CHECK(!prompts.empty(), "Flux2PromptEncoder: no prompt");
  KILN_CHECK(max_sequence_length > 0,
             "Flux2PromptEncoder: max_sequence_length must be positive, got " << max_sequence_length);
  std::vector<int64_t> ids, mask;
  for (const std::string& prompt : prompts) {
    const std::string text = chat_prompt(prompt);
    tokenizers::BpeEncodeOptions options;
    options.max_length = max_sequence_length;
    // ProcessorMixin.apply_chat_template: a rendered prompt that starts with BOS is tokenized without
    // specials.
    const std::string& bos = tokenizer_->bos_token();
    options.add_special_tokens = bos.empty() || text.rfind(bos, 0) != 0;
    const tokenizers::Encoding e = tokenizer_->encode(text, options);
    ids.insert(ids.end(), e.ids.begin(), e.ids.end());
    mask.insert(mask.end(), e.attention_mask.begin(), e.attention_mask.end());
  }
  const int64_t B = static_cast<int64_t>(prompts.size());
  return {Tensor::from_vector(ids, {B, max_sequence_length}),
          Tensor::from_vector(mask, {B, max_sequence_length})};
}

Flux2PromptEmbeddings Flux2PromptEncoder::encode(const std::vector<std::string>& prompts,
                                                 int64_t max_sequence_length,
                                                 int64_t num_images_per_prompt) const {
  KILN_CHECK(num_images_per_prompt >= 1,
             "Flux2PromptEncoder: num_images_per_prompt must be >= 1, got " << num_images_per_prompt);
  const auto [ids, mask] = tokenize(prompts, max_sequence_length);
  const std::vector<Tensor> states = encoder_->hidden_states(ids, mask, layers_);
  Tensor embeds = concat(states, 2);
  const int64_t B = embeds.size(0), S = embeds.size(1), D = embeds.size(2);
  if (num_images_per_prompt > 1) {
    embeds = embeds.unsqueeze(1)
                 .expand({B, num_images_per_prompt, S, D})
                 .reshape({B * num_images_per_prompt, S, D});
  }
  const int64_t rows = B * num_images_per_prompt;
  std::vector<int64_t> text_ids(static_cast<size_t>(rows * S * 4), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = 0; s < S; ++s) text_ids[static_cast<size_t>((r * S + s) * 4 + 3)] = s;
  }
  return {embeds, Tensor::from_vector(text_ids, {rows, S, 4})};
}

}  // namespace kiln
