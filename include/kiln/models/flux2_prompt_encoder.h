// FLUX.2's prompt encoding, as diffusers' Flux2Pipeline.encode_prompt (Mistral Small 3.x) and
// Flux2KleinPipeline.encode_prompt (Qwen3) compute it, for the pipelines to call with their prompts:
//   1. each prompt is put in the family's chat prompt (kiln/tokenizers/chat_prompts.h) and tokenized with
//      padding="max_length", truncation=True, max_length=max_sequence_length (no second BOS for Mistral: the
//      template starts with it, so the processor tokenizes without special tokens);
//   2. the text encoder runs on ids and mask (only up to the deepest layer asked) and the hidden states of
//      text_encoder_out_layers ((10, 20, 30) for Mistral, (9, 18, 27) for Qwen3; 0 = embeddings, L = final
//      norm) are concatenated per token: prompt_embeds [B, S, layers * hidden] = [h_a | h_b | h_c], in the
//      encoder's dtype, every position including padding;
//   3. num_images_per_prompt repeats each prompt's rows; text_ids [B, S, 4] int64 = (0, 0, 0, position).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/models/decoder_text_encoder.h"
#include "kiln/nn/tensor_parallel.h"
#include "kiln/tokenizers/bpe_tokenizer.h"

namespace kiln {

struct Flux2PromptEncoderOptions {
  DType dtype = float32;  // the text encoder's weights and the embeddings
  // Empty: the pipeline's default for the family.
  std::vector<int64_t> text_encoder_out_layers;
  nn::TensorParallel tp;
};

struct Flux2PromptEmbeddings {
  Tensor prompt_embeds;  // [B * num_images_per_prompt, S, layers * hidden], the encoder's dtype
  Tensor text_ids;       // [B * num_images_per_prompt, S, 4] int64
};

class Flux2PromptEncoder {
 public:
  // `model` is a pipeline folder, or a repo id in the local Hugging Face cache (kiln/io/model_ref.h), holding
  // model_index.json (Flux2Pipeline -> Mistral, Flux2KleinPipeline -> Qwen3; without it the text encoder's
  // config decides), text_encoder/ and tokenizer/.
  static Flux2PromptEncoder from_pretrained(const std::string& model,
                                            const Flux2PromptEncoderOptions& options = {});
  // The same from a pipeline's component folders (what Flux2Pipeline / Flux2KleinPipeline load): the
  // tokenizer (tokenizer.json, tokenizer_config.json) and then the text encoder (config.json and weights),
  // `on_loaded` called with "tokenizer" and "text_encoder" as each is ready.
  static Flux2PromptEncoder from_folders(const std::string& text_encoder, const std::string& tokenizer,
                                         const Flux2PromptEncoderOptions& options = {},
                                         const std::function<void(const char* component)>& on_loaded = {});

  Flux2PromptEmbeddings encode(const std::vector<std::string>& prompts, int64_t max_sequence_length = 512,
                               int64_t num_images_per_prompt = 1) const;
  // The input_ids and attention_mask [B, S] int64 diffusers feeds the text encoder.
  std::pair<Tensor, Tensor> tokenize(const std::vector<std::string>& prompts,
                                     int64_t max_sequence_length) const;
  // The chat prompt a prompt becomes before tokenization.
  std::string chat_prompt(const std::string& prompt) const;

  models::DecoderFamily family() const { return encoder_->config().family; }
  const std::vector<int64_t>& text_encoder_out_layers() const { return layers_; }
  // layers * hidden: the width of prompt_embeds (the transformer's joint_attention_dim).
  int64_t embedding_dim() const;
  models::DecoderTextEncoder& text_encoder() { return *encoder_; }
  const models::DecoderTextEncoder& text_encoder() const { return *encoder_; }
  const tokenizers::BpeTokenizer& tokenizer() const { return *tokenizer_; }

  // The default layers of each family's pipeline.
  static std::vector<int64_t> default_layers(models::DecoderFamily family);

 private:
  Flux2PromptEncoder() = default;
  std::unique_ptr<models::DecoderTextEncoder> encoder_;
  std::unique_ptr<tokenizers::BpeTokenizer> tokenizer_;
  std::vector<int64_t> layers_;
};

}  // namespace kiln
