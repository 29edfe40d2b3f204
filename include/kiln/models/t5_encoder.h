// transformers' T5EncoderModel (T5 v1.1: gated-GELU feed-forward, relative position buckets, no biases).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/nn/layers.h"

namespace kiln::models {

struct T5EncoderConfig {
  int64_t vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;
  int64_t d_ff = 2048;
  int64_t num_layers = 6;
  int64_t num_heads = 8;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  bool gated = true;                      // feed_forward_proj "gated-*"
  std::string dense_act_fn = "gelu_new";  // gelu_new (tanh GELU) or relu

  static T5EncoderConfig from_file(const std::string& config_json);
};

class T5EncoderModel : public nn::Module {
 public:
  // Tensor parallelism (`tp` size > 1): q/k/v and wi_0/wi_1 column-, o and wo row-parallel (two all-reduces
  // per block), attention on this rank's heads with its columns of the position bias; the token embedding,
  // the small relative-position table and the norms are replicated. Every rank returns the full output.
  explicit T5EncoderModel(const T5EncoderConfig& config, const nn::TensorParallel& tp = {});
  // ids [B, S] -> last hidden state [B, S, d_model]. Without `attention_mask` every token attends to every
  // other, as FluxPipeline and StableDiffusion3Pipeline call it; with one ([B, S], 1 for a token, 0 for
  // padding, as the tokenizer returns it; ChromaPipeline passes it) no token attends to the padding, as
  // transformers adds its mask to the position bias.
  Tensor forward(const Tensor& ids, const Tensor& attention_mask = {}) const;
  const T5EncoderConfig& config() const { return config_; }
  // encoder.block (streamed by group offload; their forward cannot be compiled).
  std::vector<nn::BlockList> repeated_blocks() const override;
  // The bucket of each (query, key) pair, [S, S] int64, as T5Attention._relative_position_bucket computes it.
  static Tensor relative_position_buckets(int64_t seq_len, int64_t num_buckets, int64_t max_distance);

 private:
  struct Block : nn::Module {
    Block(const T5EncoderConfig& c, bool has_relative_bias, const nn::TensorParallel& tp);
    nn::Linear q, k, v, o;
    nn::Embedding relative_attention_bias;
    nn::RMSNorm attn_norm, ff_norm;
    nn::Linear wi_0, wi_1, wo;
  };
  Tensor activation(const Tensor& x) const;

  T5EncoderConfig config_;
  nn::TensorParallel tp_;
  nn::Embedding shared_;
  std::vector<std::unique_ptr<Block>> blocks_;
  nn::RMSNorm final_layer_norm_;
};

// Reads `folder`/config.json and the weights in `folder`, converted to `dtype`. The token embedding is stored
// as shared.weight, encoder.embed_tokens.weight (tied to it) or both.
// With `tp`, only this rank's slices of the sharded layers are read.
std::unique_ptr<T5EncoderModel> load_t5_encoder(const std::string& folder, DType dtype,
                                                const nn::TensorParallel& tp = {});

}  // namespace kiln::models
