// The decoder-only language models FLUX.2 encodes prompts with, run for their hidden states:
//  - the language model of transformers' Mistral3ForConditionalGeneration (MistralModel: FLUX.2-dev's Mistral
//    Small 3.x), text path only; the vision tower and projector are not loaded;
//  - Qwen3ForCausalLM's Qwen3Model (FLUX.2 [klein], Z-Image): the same decoder with per-head RMSNorm on q and
//  k;
//  - the language model of Qwen2_5_VLForConditionalGeneration (Qwen-Image's Qwen2.5-VL-7B): biases on q, k
//  and
//    v; its multimodal RoPE is the default one for text alone. With images (Qwen-Image-Edit), the vision
//    tower's embeddings (kiln/models/qwen2_5_vl_vision.h, run by the caller) replace the <|image_pad|>
//    tokens' and the rotary frequencies split in mrope_section turn with each token's (time, row, column)
//    position.
// Both: token embedding, then layers of pre-norm grouped-query self-attention (rotate-half RoPE at positions
// 0..S-1, causal and key-padding mask) and a SwiGLU MLP, RMSNorm in the Llama style (normalised in float32,
// rounded to the activation dtype, times the weight), no biases unless the config asks for them; a final
// RMSNorm. Only the layers the caller needs are built, loaded and run.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/models/qwen2_5_vl_vision.h"
#include "kiln/nn/layers.h"

namespace kiln::models {

enum class DecoderFamily { Mistral, Qwen3, Qwen2_5_VL };

struct DecoderTextEncoderConfig {
  DecoderFamily family = DecoderFamily::Mistral;
  int64_t vocab_size = 131072;
  int64_t hidden_size = 5120;
  int64_t intermediate_size = 32768;
  int64_t num_hidden_layers = 40;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 8;
  int64_t head_dim = 128;
  double rms_norm_eps = 1e-5;
  double rope_theta = 1e9;
  bool attention_bias = false;  // Qwen3's attention_bias: biases on q, k, v and o
  bool qkv_bias = false;        // biases on q, k and v (attention_bias, or Qwen2.5-VL's)
  // Qwen2.5-VL only: how many of the head's rotary frequencies (head_dim / 2 in all) turn with the time, row
  // and column positions (rope_parameters or rope_scaling's mrope_section), the <|image_pad|> token and the
  // vision tower's spatial_merge_size (from config.json's top level and vision_config).
  std::vector<int64_t> mrope_section;
  int64_t image_token_id = -1;
  int64_t spatial_merge_size = 2;

  // A text encoder's config.json: Mistral3Config (its text_config), MistralConfig, Qwen3Config or
  // Qwen2_5_VLConfig (its text_config, or its top level as transformers 4 wrote it). RoPE comes
  // from rope_theta / rope_scaling (transformers 4) or rope_parameters (transformers 5); only the default
  // RoPE is supported, and sliding-window attention is refused (the FLUX.2 encoders have none).
  static DecoderTextEncoderConfig from_file(const std::string& config_json);
};

// Images in a Qwen2.5-VL prompt: their embeddings take the places of the image tokens, in order.
struct MultimodalInputs {
  Tensor image_embeds;  // [M, hidden_size]: every image's merged patches (Qwen2_5_VLVisionModel's output)
  std::vector<ImageGrid> grids;  // each image's patch grid; image k fills the k-th run of image tokens
  int64_t image_token_id = -1;
  int64_t spatial_merge_size = 2;
  std::vector<int64_t> mrope_section;  // sums to head_dim / 2
  // true: Qwen2.5-VL's 3-D positions (transformers' get_rope_index): text tokens count on from the previous
  // token, an image's tokens sit at (start, start + row, start + column) and the text after it starts at
  // start + max(rows, columns); padding gets 0. What the model was trained with (transformers 4, or 5 given
  // mm_token_type_ids). false: every token at its index 0..S-1, what diffusers 0.42.1's Qwen-Image-Edit
  // pipelines get from transformers 5 (they pass no mm_token_type_ids).
  bool multimodal_positions = true;
};
// The fields a config gives (image token, merge size, mrope_section) with these embeddings and grids.
MultimodalInputs multimodal_inputs(const DecoderTextEncoderConfig& config, const Tensor& image_embeds,
                                   const std::vector<ImageGrid>& grids, bool multimodal_positions = true);

class DecoderTextEncoder : public nn::Module {
 public:
  // Builds layers 0..num_layers-1 (every layer when num_layers < 0) and, when with_final_norm, the final
  // norm. Tensor parallelism (`tp` size > 1): q/k/v and gate/up column-, o and down row-parallel (two
  // all-reduces per layer), attention over this rank's query heads and their key/value heads; the embedding
  // and the norms are replicated. Every rank returns the full hidden states.
  DecoderTextEncoder(const DecoderTextEncoderConfig& config, int64_t num_layers, bool with_final_norm,
                     const nn::TensorParallel& tp = {});

  // ids [B, S] int64 and attention_mask [B, S] (1: token, 0: padding; int64) -> the hidden states
  // transformers returns with output_hidden_states=True at the requested indices, in the order asked: 0 is
  // the embedding output, k in 1..L-1 the output of layer k (1-based), L = num_hidden_layers the final-normed
  // output.
  std::vector<Tensor> hidden_states(const Tensor& ids, const Tensor& attention_mask,
                                    const std::vector<int64_t>& indices) const;
  // The same with images (Qwen2.5-VL only; null `images`: the text path above): the image tokens of `ids`
  // (every row's, in order) embedded by images->image_embeds, positions as images->multimodal_positions says.
  std::vector<Tensor> hidden_states(const Tensor& ids, const Tensor& attention_mask,
                                    const std::vector<int64_t>& indices,
                                    const MultimodalInputs* images) const;

  // The layers built; compile_repeated_blocks() compiles one program per layer shape, shared by every layer
  // (their weights bound as inputs).
  std::vector<nn::BlockList> repeated_blocks() const override;

  const DecoderTextEncoderConfig& config() const { return config_; }
  int64_t num_layers_built() const { return static_cast<int64_t>(layers_.size()); }
  // The rotate-half RoPE tables for positions 0..seq_len-1, [S, head_dim] float32 each, computed in float32
  // as transformers' default rotary embedding does.
  static std::pair<Tensor, Tensor> rope_tables(int64_t seq_len, int64_t head_dim, double theta);
  // Qwen2.5-VL's multimodal tables for positions [3, B, S] (time, row, column; int64): [B, 1, S, head_dim]
  // float32 each, frequency i of the first half turning with the axis whose mrope_section holds it.
  static std::pair<Tensor, Tensor> mrope_tables(const Tensor& positions, int64_t head_dim, double theta,
                                                const std::vector<int64_t>& mrope_section);
  // transformers' get_rope_index for ids [B, S] and attention_mask [B, S]: positions [3, B, S] int64.
  static Tensor mrope_positions(const Tensor& ids, const Tensor& attention_mask,
                                const MultimodalInputs& images);

 private:
  struct Layer : nn::Module {
    Layer(const DecoderTextEncoderConfig& c, const nn::TensorParallel& tp);
    // x [B, S, hidden] -> the layer's output; through the compiled cache when compiled.
    Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& key_mask) const;
    Tensor forward_eager(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& key_mask) const;
    bool supports_compile() const override { return true; }
    bool qk_norm;
    int64_t heads, kv_heads, head_dim;  // this rank's
    nn::RMSNorm input_layernorm, post_attention_layernorm;
    nn::Linear q_proj, k_proj, v_proj, o_proj;
    nn::RMSNorm q_norm, k_norm;  // Qwen3 only
    nn::Linear gate_proj, up_proj, down_proj;
  };
  bool supports_compile() const override { return true; }
  // image_embeds and scatter (optional): the embeddings are rows `scatter` [B * S] of the token embeddings
  // [B * S, hidden] followed by image_embeds.
  std::vector<Tensor> forward_eager(const Tensor& ids, const Tensor& key_mask, const Tensor& cos,
                                    const Tensor& sin, const std::vector<int64_t>& indices,
                                    const Tensor& image_embeds = {}, const Tensor& scatter = {}) const;
  void check_inputs(const Tensor& ids, const Tensor& attention_mask,
                    const std::vector<int64_t>& indices) const;
  Tensor key_mask(const Tensor& attention_mask) const;

  DecoderTextEncoderConfig config_;
  nn::TensorParallel tp_;
  nn::Embedding embed_tokens_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<nn::RMSNorm> norm_;
};

// What the hidden states `indices` need: layers 0..layers-1 and, when L itself is asked, the final norm.
// Throws naming `where` and an index outside 0..num_hidden_layers.
struct DecoderLayersNeeded {
  int64_t layers = 0;
  bool final_norm = false;
};
DecoderLayersNeeded decoder_layers_needed(const DecoderTextEncoderConfig& config,
                                          const std::vector<int64_t>& indices, const std::string& where);

// Loads a text encoder folder (config.json and safetensors, sharded or not) with the layers that the
// hidden-state `indices` need, converted to `dtype`. Mistral3ForConditionalGeneration checkpoints are read in
// either layout (language_model.model.* as save_pretrained writes it, or model.language_model.*); their
// vision tower, projector and lm_head are skipped, as is a Qwen3 lm_head.
std::unique_ptr<DecoderTextEncoder> load_decoder_text_encoder(const std::string& folder, DType dtype,
                                                              const std::vector<int64_t>& indices,
                                                              const nn::TensorParallel& tp = {});
// The same from any weight source (`config` read by the caller).
std::unique_ptr<DecoderTextEncoder> load_decoder_text_encoder(const DecoderTextEncoderConfig& config,
                                                              const nn::WeightSource& weights, DType dtype,
                                                              const std::vector<int64_t>& indices,
                                                              const nn::TensorParallel& tp = {});

}  // namespace kiln::models
