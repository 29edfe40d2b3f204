// transformers' CLIPTextModel / CLIPTextModelWithProjection: the CLIP text tower that FLUX uses for its
// pooled prompt vector and SD3 for pooled and per-token embeddings.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/nn/layers.h"

namespace kiln::models {

struct ClipTextConfig {
  int64_t vocab_size = 49408;
  int64_t hidden_size = 512;
  int64_t intermediate_size = 2048;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 8;
  int64_t max_position_embeddings = 77;
  std::string hidden_act = "quick_gelu";
  double layer_norm_eps = 1e-5;
  int64_t eos_token_id = 2;
  int64_t projection_dim = 512;
  bool with_projection = false;  // CLIPTextModelWithProjection (has text_projection)

  // Reads a transformers config.json (architectures[0] decides with_projection).
  static ClipTextConfig from_file(const std::string& config_json);
};

struct ClipTextOutput {
  Tensor last_hidden_state;           // [B, S, D] after final_layer_norm
  Tensor pooled;                      // [B, D] (or [B, projection_dim] text_embeds with projection)
  std::vector<Tensor> hidden_states;  // embeddings + each layer's output (when requested)
};

class ClipTextModel : public nn::Module {
 public:
  explicit ClipTextModel(const ClipTextConfig& config);
  // ids [B, S] int64/int32, S <= max_position_embeddings. The attention is causal; no padding mask (as the
  // diffusers pipelines call it).
  ClipTextOutput forward(const Tensor& ids, bool output_hidden_states = false) const;
  const ClipTextConfig& config() const { return config_; }
  // The final layer norm alone, for a hidden state of an earlier layer (diffusers' clip_skip).
  Tensor final_layer_norm(const Tensor& hidden) const { return final_layer_norm_(hidden); }
  // text_model.encoder.layers (streamed by group offload; their forward cannot be compiled).
  std::vector<nn::BlockList> repeated_blocks() const override;

 private:
  struct Layer : nn::Module {
    explicit Layer(const ClipTextConfig& c);
    nn::Linear q_proj, k_proj, v_proj, out_proj;
    nn::LayerNorm layer_norm1, layer_norm2;
    nn::Linear fc1, fc2;
  };
  Tensor activation(const Tensor& x) const;

  ClipTextConfig config_;
  nn::Embedding token_embedding_, position_embedding_;
  std::vector<std::unique_ptr<Layer>> layer_list_;
  nn::LayerNorm final_layer_norm_;
  nn::Linear text_projection_;
};

// Reads `folder`/config.json and the weights in `folder`, converted to `dtype`. Accepts both namings of the
// checkpoint ("text_model.*" as the real FLUX/SD3 repos have, and the prefix-less one transformers 5 writes).
// `weights`: the weights from elsewhere instead (a single file's view, under the "text_model.*" names).
std::unique_ptr<ClipTextModel> load_clip_text_model(const std::string& folder, DType dtype,
                                                    const nn::WeightSource* weights = nullptr);

}  // namespace kiln::models
