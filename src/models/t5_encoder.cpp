#include "kiln/models/t5_encoder.h"

#include <cmath>
#include <limits>

#include "kiln/core/limits.h"
#include "kiln/io/json_config.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/nn/renamed_weights.h"
#include "kiln/ops.h"
#include "kiln/ops/attention.h"

namespace kiln::models {

T5EncoderConfig T5EncoderConfig::from_file(const std::string& path) {
  const auto f = io::JsonConfig::load(path);
  T5EncoderConfig c;
  c.vocab_size = f.get<int64_t>("vocab_size");
  c.d_model = f.get<int64_t>("d_model");
  c.d_kv = f.get<int64_t>("d_kv");
  c.d_ff = f.get<int64_t>("d_ff");
  c.num_layers = f.get<int64_t>("num_layers");
  c.num_heads = f.get<int64_t>("num_heads");
  c.relative_attention_num_buckets = f.get_or<int64_t>("relative_attention_num_buckets", 32);
  c.relative_attention_max_distance = f.get_or<int64_t>("relative_attention_max_distance", 128);
  c.layer_norm_epsilon = f.get_or<double>("layer_norm_epsilon", 1e-6);
  using limits::kMaxLayers, limits::kMaxPositions, limits::kMaxVocabulary, limits::kMaxWidth;
  limits::check_config(
      path, {{"vocab_size", c.vocab_size, kMaxVocabulary, 1},
             {"d_model", c.d_model, kMaxWidth, 1},
             {"d_kv", c.d_kv, kMaxWidth, 1},
             {"d_ff", c.d_ff, kMaxWidth, 1},
             {"num_layers", c.num_layers, kMaxLayers, 1},
             {"num_heads", c.num_heads, kMaxWidth, 1},
             {"relative_attention_num_buckets", c.relative_attention_num_buckets, kMaxPositions, 1},
             {"relative_attention_max_distance", c.relative_attention_max_distance, kMaxPositions, 1}});
  limits::check_config(path, {{"num_heads * d_kv", c.num_heads * c.d_kv, kMaxWidth}});
  const auto proj = f.get_or<std::string>("feed_forward_proj", "relu");
  c.gated = proj.rfind("gated-", 0) == 0;
  const std::string act = c.gated ? proj.substr(6) : proj;
  // transformers maps "gated-gelu" to the tanh approximation (gelu_new) for backwards compatibility.
  c.dense_act_fn = act == "gelu" && c.gated ? "gelu_new" : f.get_or<std::string>("dense_act_fn", act);
  KILN_CHECK(
      c.dense_act_fn == "gelu_new" || c.dense_act_fn == "relu" || c.dense_act_fn == "gelu_pytorch_tanh",
      path << ": activation '" << c.dense_act_fn << "' is not supported (expected gelu_new or relu)");
  return c;
}

T5EncoderModel::Block::Block(const T5EncoderConfig& c, bool has_relative_bias, const nn::TensorParallel& tp)
    : q(c.d_model, c.num_heads * c.d_kv, false, nn::column(tp)),
      k(c.d_model, c.num_heads * c.d_kv, false, nn::column(tp)),
      v(c.d_model, c.num_heads * c.d_kv, false, nn::column(tp)),
      o(c.num_heads * c.d_kv, c.d_model, false, nn::row(tp)),
      relative_attention_bias(c.relative_attention_num_buckets, c.num_heads),
      attn_norm(c.d_model, c.layer_norm_epsilon),
      ff_norm(c.d_model, c.layer_norm_epsilon),
      wi_0(c.d_model, c.d_ff, false, nn::column(tp)),
      wi_1(c.d_model, c.d_ff, false, nn::column(tp)),
      wo(c.d_ff, c.d_model, false, nn::row(tp)) {
  register_module("layer.0.SelfAttention.q", &q);
  register_module("layer.0.SelfAttention.k", &k);
  register_module("layer.0.SelfAttention.v", &v);
  register_module("layer.0.SelfAttention.o", &o);
  if (has_relative_bias)
    register_module("layer.0.SelfAttention.relative_attention_bias", &relative_attention_bias);
  register_module("layer.0.layer_norm", &attn_norm);
  if (c.gated) {
    register_module("layer.1.DenseReluDense.wi_0", &wi_0);
    register_module("layer.1.DenseReluDense.wi_1", &wi_1);
  } else {
    register_module("layer.1.DenseReluDense.wi", &wi_0);
  }
  register_module("layer.1.DenseReluDense.wo", &wo);
  register_module("layer.1.layer_norm", &ff_norm);
}

T5EncoderModel::T5EncoderModel(const T5EncoderConfig& config, const nn::TensorParallel& tp)
    : config_(config),
      tp_(tp),
      shared_(config.vocab_size, config.d_model),
      final_layer_norm_(config.d_model, config.layer_norm_epsilon) {
  tp.split(config.num_heads, "T5EncoderModel num_heads");
  register_module("shared", &shared_);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    blocks_.push_back(std::make_unique<Block>(config, i == 0, tp));
    register_module("encoder.block." + std::to_string(i), blocks_.back().get());
  }
  register_module("encoder.final_layer_norm", &final_layer_norm_);
}

std::vector<nn::BlockList> T5EncoderModel::repeated_blocks() const {
  return {nn::block_list("encoder.block", blocks_)};
}

Tensor T5EncoderModel::relative_position_buckets(int64_t seq_len, int64_t num_buckets, int64_t max_distance) {
  // Bidirectional: half the buckets per direction; small distances exact, larger ones log-spaced. The log is
  // taken in float32, as torch does, so bucket boundaries match exactly.
  const int64_t half = num_buckets / 2, max_exact = half / 2;
  std::vector<int64_t> buckets(static_cast<size_t>(seq_len * seq_len));
  for (int64_t q = 0; q < seq_len; ++q) {
    for (int64_t k = 0; k < seq_len; ++k) {
      const int64_t rel = k - q;
      int64_t bucket = rel > 0 ? half : 0;
      const int64_t dist = rel < 0 ? -rel : rel;
      if (dist < max_exact) {
        bucket += dist;
      } else {
        const float scaled = std::log(static_cast<float>(dist) / static_cast<float>(max_exact)) /
                             static_cast<float>(std::log(static_cast<double>(max_distance) / max_exact)) *
                             static_cast<float>(half - max_exact);
        bucket += std::min<int64_t>(max_exact + static_cast<int64_t>(scaled), half - 1);
      }
      buckets[static_cast<size_t>(q * seq_len + k)] = bucket;
    }
  }
  return Tensor::from_vector(buckets, {seq_len, seq_len});
}

Tensor T5EncoderModel::activation(const Tensor& x) const {
  if (config_.dense_act_fn == "relu") return clamp(x, 0.0, std::nullopt);
  return gelu(x, GeluApproximate::Tanh);
}

Tensor T5EncoderModel::forward(const Tensor& token_ids, const Tensor& attention_mask) const {
  const Tensor ids = on_weights_device(token_ids);
  KILN_CHECK(ids.dim() == 2,
             "T5EncoderModel: expected token ids [batch, seq], got " << shape_str(ids.shape()));
  KILN_CHECK(!attention_mask.defined() || attention_mask.shape() == ids.shape(),
             "T5EncoderModel: expected an attention mask the shape of the ids "
                 << shape_str(ids.shape()) << ", got " << shape_str(attention_mask.shape()));
  // H: the heads this rank attends over (all of them without tensor parallelism).
  const int64_t B = ids.size(0), S = ids.size(1), H = config_.num_heads / tp_.size, Dk = config_.d_kv;
  Tensor x = shared_(ids);
  // Position bias [1, H, S, S], computed once from block 0's table and shared by every block. Made
  // contiguous here, once: the permuted view has a last-dim stride of H, which attention would otherwise
  // copy into rows again for every block (a strided gather of H * S * S elements, 16% of a 2-layer step).
  const Tensor buckets = on_weights_device(relative_position_buckets(
      S, config_.relative_attention_num_buckets, config_.relative_attention_max_distance));
  const Tensor bias = blocks_.front()
                          ->relative_attention_bias(buckets)
                          .narrow(2, tp_.rank * H, H)
                          .permute({2, 0, 1})
                          .unsqueeze(0)
                          .contiguous();
  AttentionOptions options;
  options.scale = 1.0;  // T5 folds the scaling into its weights
  options.bias = bias;
  if (attention_mask.defined()) {
    // transformers adds the dtype's lowest value at the padding keys to the position bias: after the
    // softmax those keys weigh exactly nothing, as here (the sum stays finite in float32).
    const Tensor keep = on_weights_device(attention_mask).to(float32).view({B, 1, 1, S});
    options.bias =
        add(bias.to(float32), mul(sub(1.0, keep), static_cast<double>(std::numeric_limits<float>::lowest())));
  }
  for (const auto& block : blocks_) {
    const Tensor h = block->attn_norm(x);
    auto heads = [&](const nn::Linear& proj) { return proj(h).view({B, S, H, Dk}).permute({0, 2, 1, 3}); };
    const Tensor attn =
        scaled_dot_product_attention(heads(block->q), heads(block->k), heads(block->v), options);
    x = add(x, block->o(attn.permute({0, 2, 1, 3}).reshape({B, S, H * Dk})));
    const Tensor f = block->ff_norm(x);
    Tensor inner = activation(block->wi_0(f));
    if (config_.gated) inner = mul(inner, block->wi_1(f));
    // transformers casts to wo's dtype first (it keeps wo in float32 for some checkpoints).
    x = add(x, block->wo(inner.to(block->wo.weight.dtype())));
  }
  return final_layer_norm_(x);
}

std::unique_ptr<T5EncoderModel> load_t5_encoder(const std::string& folder, DType dtype,
                                                const nn::TensorParallel& tp) {
  auto model = std::make_unique<T5EncoderModel>(T5EncoderConfig::from_file(folder + "/config.json"), tp);
  nn::CheckpointWeights weights(folder);
  nn::LoadOptions options;
  options.dtype = dtype;
  if (weights.contains("shared.weight")) {
    options.ignore_prefixes = {"encoder.embed_tokens.weight"};  // the tied copy, when stored too
    model->load_weights(weights, options);
    return model;
  }
  const nn::RenamedWeights untied(weights, [](const std::string& name) {
    return name == "encoder.embed_tokens.weight" ? std::string("shared.weight") : name;
  });
  model->load_weights(untied, options);
  return model;
}

}  // namespace kiln::models
