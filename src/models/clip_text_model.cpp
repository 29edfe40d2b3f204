#include "kiln/models/clip_text_model.h"

#include <cmath>

#include "kiln/core/limits.h"
#include "kiln/io/json_config.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/nn/renamed_weights.h"
#include "kiln/ops.h"
#include "kiln/ops/attention.h"

namespace kiln::models {

ClipTextConfig ClipTextConfig::from_file(const std::string& path) {
  const auto f = io::JsonConfig::load(path);
  ClipTextConfig c;
  c.vocab_size = f.get<int64_t>("vocab_size");
  c.hidden_size = f.get<int64_t>("hidden_size");
  c.intermediate_size = f.get<int64_t>("intermediate_size");
  c.num_hidden_layers = f.get<int64_t>("num_hidden_layers");
  c.num_attention_heads = f.get<int64_t>("num_attention_heads");
  c.max_position_embeddings = f.get_or<int64_t>("max_position_embeddings", 77);
  c.hidden_act = f.get_or<std::string>("hidden_act", "quick_gelu");
  c.layer_norm_eps = f.get_or<double>("layer_norm_eps", 1e-5);
  c.eos_token_id = f.get_or<int64_t>("eos_token_id", 2);
  c.projection_dim = f.get_or<int64_t>("projection_dim", c.hidden_size);
  const auto architectures = f.get_or<std::vector<std::string>>("architectures", {});
  if (!architectures.empty()) {
    const std::string& arch = architectures.front();
    KILN_CHECK(arch == "CLIPTextModel" || arch == "CLIPTextModelWithProjection",
               path << ": architecture '" << arch
                    << "' is not a CLIP text model (expected CLIPTextModel or CLIPTextModelWithProjection)");
    c.with_projection = arch == "CLIPTextModelWithProjection";
  }
  using limits::kMaxLayers, limits::kMaxPositions, limits::kMaxVocabulary, limits::kMaxWidth;
  limits::check_config(path, {{"vocab_size", c.vocab_size, kMaxVocabulary, 1},
                              {"hidden_size", c.hidden_size, kMaxWidth, 1},
                              {"intermediate_size", c.intermediate_size, kMaxWidth, 1},
                              {"num_hidden_layers", c.num_hidden_layers, kMaxLayers, 1},
                              {"num_attention_heads", c.num_attention_heads, kMaxWidth, 1},
                              {"max_position_embeddings", c.max_position_embeddings, kMaxPositions, 1},
                              {"projection_dim", c.projection_dim, kMaxWidth, 1}});
  KILN_CHECK(c.hidden_act == "quick_gelu" || c.hidden_act == "gelu",
             path << ": hidden_act '" << c.hidden_act << "' is not supported (expected quick_gelu or gelu)");
  KILN_CHECK(c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0,
             path << ": hidden_size " << c.hidden_size << " is not divisible by num_attention_heads "
                  << c.num_attention_heads);
  return c;
}

ClipTextModel::Layer::Layer(const ClipTextConfig& c)
    : q_proj(c.hidden_size, c.hidden_size),
      k_proj(c.hidden_size, c.hidden_size),
      v_proj(c.hidden_size, c.hidden_size),
      out_proj(c.hidden_size, c.hidden_size),
      layer_norm1(c.hidden_size, c.layer_norm_eps),
      layer_norm2(c.hidden_size, c.layer_norm_eps),
      fc1(c.hidden_size, c.intermediate_size),
      fc2(c.intermediate_size, c.hidden_size) {
  register_module("self_attn.q_proj", &q_proj);
  register_module("self_attn.k_proj", &k_proj);
  register_module("self_attn.v_proj", &v_proj);
  register_module("self_attn.out_proj", &out_proj);
  register_module("layer_norm1", &layer_norm1);
  register_module("mlp.fc1", &fc1);
  register_module("mlp.fc2", &fc2);
  register_module("layer_norm2", &layer_norm2);
}

ClipTextModel::ClipTextModel(const ClipTextConfig& config)
    : config_(config),
      token_embedding_(config.vocab_size, config.hidden_size),
      position_embedding_(config.max_position_embeddings, config.hidden_size),
      final_layer_norm_(config.hidden_size, config.layer_norm_eps),
      text_projection_(config.hidden_size, config.projection_dim, /*bias=*/false) {
  register_module("text_model.embeddings.token_embedding", &token_embedding_);
  register_module("text_model.embeddings.position_embedding", &position_embedding_);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layer_list_.push_back(std::make_unique<Layer>(config));
    register_module("text_model.encoder.layers." + std::to_string(i), layer_list_.back().get());
  }
  register_module("text_model.final_layer_norm", &final_layer_norm_);
  if (config.with_projection) register_module("text_projection", &text_projection_);
}

std::vector<nn::BlockList> ClipTextModel::repeated_blocks() const {
  return {nn::block_list("text_model.encoder.layers", layer_list_)};
}

Tensor ClipTextModel::activation(const Tensor& x) const {
  if (config_.hidden_act == "gelu") return gelu(x);
  return quick_gelu(x);
}

ClipTextOutput ClipTextModel::forward(const Tensor& token_ids, bool output_hidden_states) const {
  const Tensor ids = on_weights_device(token_ids);
  KILN_CHECK(ids.dim() == 2,
             "CLIPTextModel: expected token ids [batch, seq], got " << shape_str(ids.shape()));
  const int64_t B = ids.size(0), S = ids.size(1), D = config_.hidden_size, H = config_.num_attention_heads;
  KILN_CHECK(
      S <= config_.max_position_embeddings,
      "CLIPTextModel: " << S << " tokens exceed max_position_embeddings " << config_.max_position_embeddings);
  ClipTextOutput out;
  const Tensor positions = position_embedding_.weight.narrow(0, 0, S);
  Tensor x = add(token_embedding_(ids), positions);
  if (output_hidden_states) out.hidden_states.push_back(x);
  for (const auto& layer : layer_list_) {
    const Tensor h = layer->layer_norm1(x);
    auto heads = [&](const nn::Linear& proj) { return proj(h).view({B, S, H, D / H}).permute({0, 2, 1, 3}); };
    AttentionOptions options;
    options.is_causal = true;
    const Tensor attn = scaled_dot_product_attention(heads(layer->q_proj), heads(layer->k_proj),
                                                     heads(layer->v_proj), options);
    x = add(x, layer->out_proj(attn.permute({0, 2, 1, 3}).reshape({B, S, D})));
    x = add(x, layer->fc2(activation(layer->fc1(layer->layer_norm2(x)))));
    if (output_hidden_states) out.hidden_states.push_back(x);
  }
  out.last_hidden_state = final_layer_norm_(x);

  // transformers' pooling: with the legacy eos_token_id 2 the EOS row is found by argmax of the ids (the EOS
  // has the largest id in CLIP's vocabulary); otherwise it is the first position holding eos_token_id.
  const auto id_values = token_ids.to(int64).to_vector<int64_t>();  // as given: no read back from a device
  std::vector<Tensor> rows;
  for (int64_t b = 0; b < B; ++b) {
    int64_t pick = 0;
    if (config_.eos_token_id == 2) {
      for (int64_t s = 1; s < S; ++s)
        if (id_values[b * S + s] > id_values[b * S + pick]) pick = s;
    } else {
      pick = S - 1;
      for (int64_t s = 0; s < S; ++s)
        if (id_values[b * S + s] == config_.eos_token_id) {
          pick = s;
          break;
        }
    }
    rows.push_back(out.last_hidden_state.select(0, b).select(0, pick));
  }
  out.pooled = stack(rows, 0);
  if (config_.with_projection) out.pooled = text_projection_(out.pooled);
  return out;
}

std::unique_ptr<ClipTextModel> load_clip_text_model(const std::string& folder, DType dtype,
                                                    const nn::WeightSource* from) {
  auto model = std::make_unique<ClipTextModel>(ClipTextConfig::from_file(folder + "/config.json"));
  nn::LoadOptions options;
  options.dtype = dtype;
  if (from != nullptr) {
    model->load_weights(*from, options);
    return model;
  }
  nn::CheckpointWeights weights(folder);
  options.ignore_prefixes = {"text_model.embeddings.position_ids"};  // a buffer older transformers saved
  const nn::RenamedWeights prefixed(weights, [](const std::string& name) {
    return name.rfind("text_model.", 0) == 0 || name.rfind("text_projection.", 0) == 0 ? name
                                                                                       : "text_model." + name;
  });
  model->load_weights(prefixed, options);
  return model;
}

}  // namespace kiln::models
