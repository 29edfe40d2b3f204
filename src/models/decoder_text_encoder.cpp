#include "kiln/models/decoder_text_encoder.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/core/limits.h"
#include "kiln/io/json_config.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/nn/renamed_weights.h"
#include "kiln/ops.h"
#include "kiln/ops/attention.h"

namespace kiln::models {
namespace {

// RoPE settings, from transformers 5's rope_parameters or transformers 4's rope_theta / rope_scaling.
// Qwen2.5-VL's multimodal RoPE ("mrope": the frequencies in three sections, rotated by a token's time,
// height and width positions) is the default RoPE for text alone, whose three positions are its index.
double read_rope_theta(const io::JsonConfig& c, bool multimodal) {
  std::string type = "default";
  double theta = 10000.0;
  if (c.has("rope_parameters")) {
    const auto rope = c.object("rope_parameters");
    type = rope.get_or<std::string>("rope_type", "default");
    theta = rope.get<double>("rope_theta");
  } else {
    theta = c.get_or<double>("rope_theta", theta);
    if (c.has("rope_scaling")) {
      const auto scaling = c.object("rope_scaling");
      type = scaling.has("rope_type") ? scaling.get<std::string>("rope_type")
                                      : scaling.get_or<std::string>("type", "default");
    }
  }
  if (multimodal && c.has("rope_parameters")) {
    const auto rope = c.object("rope_parameters");
    if (rope.get_or<std::string>("type", "default") == "mrope") type = "default";
  }
  if (multimodal && type == "mrope") type = "default";
  KILN_CHECK(type == "default",
             c.where("rope_parameters")
                 << ": RoPE type \"" << type
                 << "\" is not supported (the text encoders Kiln runs use the default RoPE)");
  return theta;
}

// Rotate-half RoPE as transformers applies it: in float32 one fused op; in bf16/f16 transformers casts the
// tables to the activation dtype and rounds after each product and the sum (q * cos + rotate_half(q) * sin),
// which the unfused ops reproduce.
// Multimodal tables [B, 1, S, D] take the unfused ops in float32 too (the same products and sum).
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  if (x.dtype() == float32 && cos.dim() == 2) return apply_rope(x, cos, sin, RopeStyle::RotateHalf);
  const int64_t half = x.size(-1) / 2;
  const Tensor rotated = concat({neg(x.narrow(-1, half, half)), x.narrow(-1, 0, half)}, -1);
  return add(mul(x, cos.to(x.dtype())), mul(rotated, sin.to(x.dtype())));
}

// Qwen2.5-VL's mrope_section, from rope_parameters (transformers 5) or rope_scaling (transformers 4).
std::vector<int64_t> read_mrope_section(const io::JsonConfig& c) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (c.has(key) && c.object(key).has("mrope_section"))
      return c.object(key).get<std::vector<int64_t>>("mrope_section");
  }
  return {};
}

}  // namespace

DecoderTextEncoderConfig DecoderTextEncoderConfig::from_file(const std::string& path) {
  const auto file = io::JsonConfig::load(path);
  const std::string model_type = file.get_or<std::string>("model_type", "");
  // Mistral3's text model is its text_config; Qwen2.5-VL's too under transformers 5, at the top level in the
  // files transformers 4 wrote (Qwen-Image's).
  const bool nested = model_type == "mistral3" || (model_type == "qwen2_5_vl" && file.has("text_config"));
  const io::JsonConfig c = nested ? file.object("text_config") : file;
  std::string text_type = c.get_or<std::string>("model_type", model_type == "mistral3" ? "mistral" : "");
  if (text_type == "qwen2_5_vl_text") text_type = "qwen2_5_vl";
  DecoderTextEncoderConfig r;
  if (text_type == "mistral") {
    r.family = DecoderFamily::Mistral;
  } else if (text_type == "qwen3") {
    r.family = DecoderFamily::Qwen3;
  } else if (text_type == "qwen2_5_vl") {
    r.family = DecoderFamily::Qwen2_5_VL;
  } else {
    KILN_FAIL(path << ": model_type \"" << (text_type.empty() ? model_type : text_type)
                   << "\" is not a text encoder Kiln runs (expected mistral3, mistral, qwen3 or qwen2_5_vl)");
  }
  r.vocab_size = c.get<int64_t>("vocab_size");
  r.hidden_size = c.get<int64_t>("hidden_size");
  r.intermediate_size = c.get<int64_t>("intermediate_size");
  r.num_hidden_layers = c.get<int64_t>("num_hidden_layers");
  r.num_attention_heads = c.get<int64_t>("num_attention_heads");
  r.num_key_value_heads = c.get_or<int64_t>("num_key_value_heads", r.num_attention_heads);
  // hidden_size / num_attention_heads when absent (num_attention_heads is checked positive below).
  r.head_dim = c.has("head_dim")           ? c.get<int64_t>("head_dim")
               : r.num_attention_heads > 0 ? r.hidden_size / r.num_attention_heads
                                           : 0;
  r.rms_norm_eps = c.get_or<double>("rms_norm_eps", 1e-6);
  r.rope_theta = read_rope_theta(c, r.family == DecoderFamily::Qwen2_5_VL);
  // Qwen2's attention has biases on q, k and v (not o), whatever the config says.
  r.attention_bias = r.family == DecoderFamily::Qwen2_5_VL ? false : c.get_or<bool>("attention_bias", false);
  r.qkv_bias = r.family == DecoderFamily::Qwen2_5_VL || r.attention_bias;
  KILN_CHECK(c.get_or<std::string>("hidden_act", "silu") == "silu",
             c.where("hidden_act") << ": expected \"silu\" (SwiGLU MLP)");
  const bool sliding = r.family == DecoderFamily::Mistral ? c.has("sliding_window")
                                                          : c.get_or<bool>("use_sliding_window", false);
  KILN_CHECK(!sliding, c.where("sliding_window") << ": sliding-window attention is not supported");
  for (auto [name, v] : {std::pair<const char*, int64_t>{"vocab_size", r.vocab_size},
                         {"hidden_size", r.hidden_size},
                         {"intermediate_size", r.intermediate_size},
                         {"num_hidden_layers", r.num_hidden_layers},
                         {"num_attention_heads", r.num_attention_heads},
                         {"num_key_value_heads", r.num_key_value_heads},
                         {"head_dim", r.head_dim}}) {
    KILN_CHECK(v > 0, c.where(name) << ": must be positive, got " << v);
  }
  // Upper bounds too, before any product of them is formed or a model of that size is built.
  using limits::kMaxLayers, limits::kMaxVocabulary, limits::kMaxWidth;
  limits::check_config(path, {{"vocab_size", r.vocab_size, kMaxVocabulary},
                              {"hidden_size", r.hidden_size, kMaxWidth},
                              {"intermediate_size", r.intermediate_size, kMaxWidth},
                              {"num_hidden_layers", r.num_hidden_layers, kMaxLayers},
                              {"num_attention_heads", r.num_attention_heads, kMaxWidth},
                              {"num_key_value_heads", r.num_key_value_heads, kMaxWidth},
                              {"head_dim", r.head_dim, kMaxWidth}});
  limits::check_config(path,
                       {{"num_attention_heads * head_dim", r.num_attention_heads * r.head_dim, kMaxWidth}});
  KILN_CHECK(std::isfinite(r.rope_theta) && r.rope_theta > 0,
             c.where("rope_theta") << ": expected a positive value, got " << r.rope_theta);
  KILN_CHECK(std::isfinite(r.rms_norm_eps) && r.rms_norm_eps > 0 && r.rms_norm_eps < 1,
             c.where("rms_norm_eps") << ": expected a value in (0, 1), got " << r.rms_norm_eps);
  KILN_CHECK(r.num_attention_heads % r.num_key_value_heads == 0,
             c.where("num_key_value_heads")
                 << ": " << r.num_key_value_heads << " does not divide num_attention_heads "
                 << r.num_attention_heads);
  KILN_CHECK(r.head_dim % 2 == 0, c.where("head_dim") << ": RoPE needs an even head_dim, got " << r.head_dim);
  if (r.family == DecoderFamily::Qwen2_5_VL) {
    r.mrope_section = read_mrope_section(c);
    int64_t total = 0;
    for (int64_t v : r.mrope_section) {
      KILN_CHECK(v >= 0 && v <= r.head_dim, c.where("mrope_section")
                                                << ": " << v << " is not in 0..head_dim");
      total += v;
    }
    KILN_CHECK(r.mrope_section.empty() || (r.mrope_section.size() == 3 && total == r.head_dim / 2),
               c.where("mrope_section")
                   << ": expected 3 sections summing to head_dim / 2 = " << r.head_dim / 2);
    r.image_token_id = file.get_or<int64_t>("image_token_id", r.image_token_id);
    if (file.has("vision_config")) {
      r.spatial_merge_size = file.object("vision_config").get_or<int64_t>("spatial_merge_size", 2);
      KILN_CHECK(r.spatial_merge_size > 0 && r.spatial_merge_size <= 64,
                 file.where("vision_config.spatial_merge_size")
                     << ": expected 1..64, got " << r.spatial_merge_size);
    }
  }
  return r;
}

DecoderTextEncoder::Layer::Layer(const DecoderTextEncoderConfig& c, const nn::TensorParallel& tp)
    : qk_norm(c.family == DecoderFamily::Qwen3),
      heads(c.num_attention_heads / tp.size),
      kv_heads(c.num_key_value_heads / tp.size),
      head_dim(c.head_dim),
      input_layernorm(c.hidden_size, c.rms_norm_eps, true, RmsNormStyle::Llama),
      post_attention_layernorm(c.hidden_size, c.rms_norm_eps, true, RmsNormStyle::Llama),
      q_proj(c.hidden_size, c.num_attention_heads * c.head_dim, c.qkv_bias, nn::column(tp)),
      k_proj(c.hidden_size, c.num_key_value_heads * c.head_dim, c.qkv_bias, nn::column(tp)),
      v_proj(c.hidden_size, c.num_key_value_heads * c.head_dim, c.qkv_bias, nn::column(tp)),
      o_proj(c.num_attention_heads * c.head_dim, c.hidden_size, c.attention_bias, nn::row(tp)),
      q_norm(c.head_dim, c.rms_norm_eps, true, RmsNormStyle::Llama),
      k_norm(c.head_dim, c.rms_norm_eps, true, RmsNormStyle::Llama),
      gate_proj(c.hidden_size, c.intermediate_size, false, nn::column(tp)),
      up_proj(c.hidden_size, c.intermediate_size, false, nn::column(tp)),
      down_proj(c.intermediate_size, c.hidden_size, false, nn::row(tp)) {
  register_module("input_layernorm", &input_layernorm);
  register_module("post_attention_layernorm", &post_attention_layernorm);
  register_module("self_attn.q_proj", &q_proj);
  register_module("self_attn.k_proj", &k_proj);
  register_module("self_attn.v_proj", &v_proj);
  register_module("self_attn.o_proj", &o_proj);
  if (c.family == DecoderFamily::Qwen3) {
    register_module("self_attn.q_norm", &q_norm);
    register_module("self_attn.k_norm", &k_norm);
  }
  register_module("mlp.gate_proj", &gate_proj);
  register_module("mlp.up_proj", &up_proj);
  register_module("mlp.down_proj", &down_proj);
}

DecoderTextEncoder::DecoderTextEncoder(const DecoderTextEncoderConfig& config, int64_t num_layers,
                                       bool with_final_norm, const nn::TensorParallel& tp)
    : config_(config), tp_(tp), embed_tokens_(config.vocab_size, config.hidden_size) {
  KILN_CHECK(num_layers <= config.num_hidden_layers, "DecoderTextEncoder: " << num_layers
                                                                            << " layers asked, the model has "
                                                                            << config.num_hidden_layers);
  // Query heads and key/value heads split alike, so each rank's query heads read its own key/value heads.
  tp.split(config.num_key_value_heads, "DecoderTextEncoder num_key_value_heads");
  tp.split(config.intermediate_size, "DecoderTextEncoder intermediate_size");
  register_module("embed_tokens", &embed_tokens_);
  const int64_t n = num_layers < 0 ? config.num_hidden_layers : num_layers;
  for (int64_t i = 0; i < n; ++i) {
    layers_.push_back(std::make_unique<Layer>(config, tp));
    register_module("layers." + std::to_string(i), layers_.back().get());
  }
  if (with_final_norm) {
    norm_ = std::make_unique<nn::RMSNorm>(config.hidden_size, config.rms_norm_eps, true, RmsNormStyle::Llama);
    register_module("norm", norm_.get());
  }
}

std::pair<Tensor, Tensor> DecoderTextEncoder::rope_tables(int64_t seq_len, int64_t head_dim, double theta) {
  // transformers: inv_freq = 1 / theta ** (arange(0, D, 2) / D) in float32, angles = inv_freq * position in
  // float32, each angle used for elements i and i + D/2.
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  std::vector<float> cos(static_cast<size_t>(seq_len * head_dim)), sin(cos.size());
  for (int64_t s = 0; s < seq_len; ++s) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = inv_freq[static_cast<size_t>(i)] * static_cast<float>(s);
      const size_t at = static_cast<size_t>(s * head_dim + i);
      cos[at] = cos[at + static_cast<size_t>(half)] = std::cos(angle);
      sin[at] = sin[at + static_cast<size_t>(half)] = std::sin(angle);
    }
  }
  return {Tensor::from_vector(cos, {seq_len, head_dim}), Tensor::from_vector(sin, {seq_len, head_dim})};
}

Tensor DecoderTextEncoder::Layer::forward(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                          const Tensor& key_mask) const {
  return call_compiled({x, cos, sin, key_mask}, [this](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{forward_eager(in[0], in[1], in[2], in[3])};
  })[0];
}

Tensor DecoderTextEncoder::Layer::forward_eager(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                                const Tensor& key_mask) const {
  const int64_t B = x.size(0), S = x.size(1), H = heads, Hkv = kv_heads, D = head_dim;
  const Tensor h = input_layernorm(x);
  Tensor q = q_proj(h).view({B, S, H, D});
  Tensor k = k_proj(h).view({B, S, Hkv, D});
  const Tensor v = v_proj(h).view({B, S, Hkv, D}).permute({0, 2, 1, 3});
  if (qk_norm) {
    q = q_norm(q);
    k = k_norm(k);
  }
  q = rope(q.permute({0, 2, 1, 3}), cos, sin);
  k = rope(k.permute({0, 2, 1, 3}), cos, sin);
  // Grouped-query attention: query head j reads key/value head j / (H / Hkv), as transformers' repeat_kv.
  auto repeat = [&](const Tensor& t) {
    if (H == Hkv) return t;
    return t.unsqueeze(2).expand({B, Hkv, H / Hkv, S, D}).reshape({B, H, S, D});
  };
  AttentionOptions options;
  options.is_causal = true;
  options.bias = key_mask;
  const Tensor attn = scaled_dot_product_attention(q, repeat(k), repeat(v), options);
  const Tensor out = add(x, o_proj(attn.permute({0, 2, 1, 3}).reshape({B, S, H * D})));
  const Tensor f = post_attention_layernorm(out);
  return add(out, down_proj(mul(silu(gate_proj(f)), up_proj(f))));
}

std::vector<nn::BlockList> DecoderTextEncoder::repeated_blocks() const {
  return {nn::block_list("layers", layers_)};
}

void DecoderTextEncoder::check_inputs(const Tensor& ids, const Tensor& attention_mask,
                                      const std::vector<int64_t>& indices) const {
  KILN_CHECK(ids.dim() == 2 && ids.dtype() == int64,
             "DecoderTextEncoder: expected int64 token ids [batch, seq], got "
                 << dtype_name(ids.dtype()) << " " << shape_str(ids.shape()));
  KILN_CHECK(attention_mask.shape() == ids.shape(),
             "DecoderTextEncoder: attention_mask " << shape_str(attention_mask.shape())
                                                   << " must have the ids' shape " << shape_str(ids.shape()));
  const int64_t L = config_.num_hidden_layers;
  KILN_CHECK(!indices.empty(), "DecoderTextEncoder: no hidden state asked");
  for (int64_t k : indices) {
    KILN_CHECK(k >= 0 && k <= L, "DecoderTextEncoder: hidden state " << k << " asked, expected 0.." << L);
    KILN_CHECK(k < L ? k <= num_layers_built() : norm_ && num_layers_built() == L,
               "DecoderTextEncoder: hidden state " << k << " needs layers this model was not built with ("
                                                   << num_layers_built() << " of " << L << " built"
                                                   << (norm_ ? "" : ", no final norm") << ")");
  }
  // Out-of-range ids would read outside the embedding table: refuse them with the offending value.
  for (int64_t id : ids.contiguous().to_vector<int64_t>()) {
    KILN_CHECK(id >= 0 && id < config_.vocab_size, "DecoderTextEncoder: token id "
                                                       << id << " outside the vocabulary (0.."
                                                       << config_.vocab_size - 1 << ")");
  }
}

Tensor DecoderTextEncoder::key_mask(const Tensor& attention_mask) const {
  // Keys with mask 0 are never attended: an additive -inf bias [B, 1, 1, S] beside the causal mask.
  const int64_t B = attention_mask.size(0), S = attention_mask.size(1);
  std::vector<float> bias(static_cast<size_t>(B * S));
  const std::vector<int64_t> mask = attention_mask.contiguous().to(int64).to_vector<int64_t>();
  for (size_t i = 0; i < bias.size(); ++i)
    bias[i] = mask[i] != 0 ? 0.0f : -std::numeric_limits<float>::infinity();
  return Tensor::from_vector(bias, {B, 1, 1, S});
}

std::vector<Tensor> DecoderTextEncoder::hidden_states(const Tensor& ids, const Tensor& attention_mask,
                                                      const std::vector<int64_t>& indices) const {
  check_inputs(ids, attention_mask, indices);
  const auto [cos, sin] = rope_tables(ids.size(1), config_.head_dim, config_.rope_theta);
  std::string key = "hidden_states";
  for (int64_t k : indices) key += " " + std::to_string(k);
  return call_compiled(
      {on_weights_device(ids), on_weights_device(key_mask(attention_mask)), on_weights_device(cos),
       on_weights_device(sin)},
      [this, &indices](const std::vector<Tensor>& in) {
        return forward_eager(in[0], in[1], in[2], in[3], indices);
      },
      key);
}

std::vector<Tensor> DecoderTextEncoder::hidden_states(const Tensor& ids, const Tensor& attention_mask,
                                                      const std::vector<int64_t>& indices,
                                                      const MultimodalInputs* images) const {
  if (images == nullptr) return hidden_states(ids, attention_mask, indices);
  KILN_CHECK(config_.family == DecoderFamily::Qwen2_5_VL,
             "DecoderTextEncoder: images are only read by Qwen2.5-VL's language model");
  check_inputs(ids, attention_mask, indices);
  const Tensor& embeds = images->image_embeds;
  KILN_CHECK(embeds.dim() == 2 && embeds.size(1) == config_.hidden_size,
             "DecoderTextEncoder: image_embeds " << shape_str(embeds.shape()) << " should be [M, "
                                                 << config_.hidden_size << "]");
  KILN_CHECK(images->spatial_merge_size > 0, "DecoderTextEncoder: spatial_merge_size must be positive");
  int64_t expected = 0;
  for (const ImageGrid& g : images->grids) {
    KILN_CHECK(g.t > 0 && g.t <= 1024 && g.h > 0 && g.h <= limits::kMaxImageSide && g.w > 0 &&
                   g.w <= limits::kMaxImageSide,
               "DecoderTextEncoder: image grid (" << g.t << ", " << g.h << ", " << g.w << ") out of range");
  }
  for (const ImageGrid& g : images->grids)
    expected += g.patches() / (images->spatial_merge_size * images->spatial_merge_size);
  const int64_t B = ids.size(0), S = ids.size(1);
  // The embeddings: row i of the token embeddings [B * S, hidden], or image embedding k for the k-th image
  // token.
  const std::vector<int64_t> id = ids.contiguous().to_vector<int64_t>();
  std::vector<int64_t> scatter(id.size());
  int64_t k = 0;
  for (size_t i = 0; i < id.size(); ++i) {
    scatter[i] = id[i] == images->image_token_id ? B * S + k++ : static_cast<int64_t>(i);
  }
  KILN_CHECK(k == embeds.size(0) && k == expected,
             "DecoderTextEncoder: " << k << " image tokens (id " << images->image_token_id << ") for "
                                    << embeds.size(0) << " image embeddings (the grids make " << expected
                                    << ")");
  Tensor cos, sin;
  if (images->multimodal_positions) {
    std::tie(cos, sin) = mrope_tables(mrope_positions(ids, attention_mask, *images), config_.head_dim,
                                      config_.rope_theta, images->mrope_section);
  } else {
    std::tie(cos, sin) = rope_tables(S, config_.head_dim, config_.rope_theta);
  }
  std::string key =
      images->multimodal_positions ? "multimodal 3-D hidden_states" : "multimodal hidden_states";
  for (int64_t i : indices) key += " " + std::to_string(i);
  return call_compiled(
      {on_weights_device(ids), on_weights_device(key_mask(attention_mask)), on_weights_device(cos),
       on_weights_device(sin), on_weights_device(embeds),
       on_weights_device(Tensor::from_vector(scatter, {B * S}))},
      [this, &indices](const std::vector<Tensor>& in) {
        return forward_eager(in[0], in[1], in[2], in[3], indices, in[4], in[5]);
      },
      key);
}

Tensor DecoderTextEncoder::mrope_positions(const Tensor& ids, const Tensor& attention_mask,
                                           const MultimodalInputs& images) {
  const int64_t B = ids.size(0), S = ids.size(1), merge = images.spatial_merge_size;
  const std::vector<int64_t> id = ids.contiguous().to_vector<int64_t>();
  const std::vector<int64_t> mask = attention_mask.contiguous().to(int64).to_vector<int64_t>();
  std::vector<int64_t> out(static_cast<size_t>(3 * B * S), 0);
  auto at = [&](int64_t axis, int64_t b, int64_t s) -> int64_t& {
    return out[static_cast<size_t>((axis * B + b) * S + s)];
  };
  size_t image = 0;
  for (int64_t b = 0; b < B; ++b) {
    // The row's tokens (padding skipped) in runs of text and of image tokens; each image run is one image.
    std::vector<int64_t> kept;
    for (int64_t s = 0; s < S; ++s) {
      if (mask[static_cast<size_t>(b * S + s)] != 0) kept.push_back(s);
    }
    int64_t current = 0;
    for (size_t i = 0; i < kept.size();) {
      const bool is_image = id[static_cast<size_t>(b * S + kept[i])] == images.image_token_id;
      size_t end = i;
      while (end < kept.size() &&
             (id[static_cast<size_t>(b * S + kept[end])] == images.image_token_id) == is_image)
        ++end;
      if (!is_image) {
        for (size_t j = i; j < end; ++j) {
          for (int64_t axis = 0; axis < 3; ++axis)
            at(axis, b, kept[j]) = current + static_cast<int64_t>(j - i);
        }
        current += static_cast<int64_t>(end - i);
      } else {
        KILN_CHECK(image < images.grids.size(), "DecoderTextEncoder: more runs of image tokens than the "
                                                    << images.grids.size() << " image grids given");
        const ImageGrid& g = images.grids[image++];
        const int64_t gh = g.h / merge, gw = g.w / merge;
        KILN_CHECK(static_cast<int64_t>(end - i) == g.t * gh * gw,
                   "DecoderTextEncoder: image " << image - 1 << " has " << end - i << " tokens, its grid ("
                                                << g.t << ", " << g.h << ", " << g.w << ") makes "
                                                << g.t * gh * gw);
        size_t j = i;
        for (int64_t t = 0; t < g.t; ++t) {
          for (int64_t y = 0; y < gh; ++y) {
            for (int64_t x = 0; x < gw; ++x, ++j) {
              at(0, b, kept[j]) = current + t;
              at(1, b, kept[j]) = current + y;
              at(2, b, kept[j]) = current + x;
            }
          }
        }
        current += std::max(gh, gw);
      }
      i = end;
    }
  }
  return Tensor::from_vector(out, {3, B, S});
}

std::pair<Tensor, Tensor> DecoderTextEncoder::mrope_tables(const Tensor& positions, int64_t head_dim,
                                                           double theta,
                                                           const std::vector<int64_t>& mrope_section) {
  const int64_t half = head_dim / 2, B = positions.size(1), S = positions.size(2);
  int64_t total = 0;
  for (int64_t v : mrope_section) total += v;
  KILN_CHECK(mrope_section.size() == 3 && total == half,
             "DecoderTextEncoder: mrope_section must have 3 sections summing to head_dim / 2 = " << half);
  std::vector<int64_t> axis_of(static_cast<size_t>(half));
  for (int64_t i = 0, axis = 0, end = mrope_section[0]; i < half; ++i) {
    while (i >= end) end += mrope_section[static_cast<size_t>(++axis)];
    axis_of[static_cast<size_t>(i)] = axis;
  }
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  const std::vector<int64_t> pos = positions.contiguous().to_vector<int64_t>();
  std::vector<float> cos(static_cast<size_t>(B * S * head_dim)), sin(cos.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t axis = axis_of[static_cast<size_t>(i)];
        const float p = static_cast<float>(pos[static_cast<size_t>((axis * B + b) * S + s)]);
        const float angle = p * inv_freq[static_cast<size_t>(i)];
        const size_t at = static_cast<size_t>((b * S + s) * head_dim + i);
        cos[at] = cos[at + static_cast<size_t>(half)] = std::cos(angle);
        sin[at] = sin[at + static_cast<size_t>(half)] = std::sin(angle);
      }
    }
  }
  return {Tensor::from_vector(cos, {B, 1, S, head_dim}), Tensor::from_vector(sin, {B, 1, S, head_dim})};
}

std::vector<Tensor> DecoderTextEncoder::forward_eager(const Tensor& ids, const Tensor& key_mask,
                                                      const Tensor& cos, const Tensor& sin,
                                                      const std::vector<int64_t>& indices,
                                                      const Tensor& image_embeds,
                                                      const Tensor& scatter) const {
  const int64_t L = config_.num_hidden_layers;
  const int64_t deepest = *std::max_element(indices.begin(), indices.end());
  std::vector<Tensor> states(static_cast<size_t>(L + 1));
  Tensor x = embed_tokens_(ids);
  if (image_embeds.defined()) {
    const int64_t B = x.size(0), S = x.size(1), D = x.size(2);
    x = embedding(concat({x.reshape({B * S, D}), image_embeds.to(x.dtype())}, 0), scatter).reshape({B, S, D});
  }
  states[0] = x;
  const int64_t run = std::min<int64_t>(deepest, num_layers_built());
  for (int64_t i = 0; i < run; ++i) {
    x = layers_[static_cast<size_t>(i)]->forward(x, cos, sin, key_mask);
    states[static_cast<size_t>(i + 1)] = x;
  }
  if (deepest == L) states[static_cast<size_t>(L)] = (*norm_)(x);
  std::vector<Tensor> out;
  out.reserve(indices.size());
  for (int64_t k : indices) out.push_back(states[static_cast<size_t>(k)]);
  return out;
}

MultimodalInputs multimodal_inputs(const DecoderTextEncoderConfig& config, const Tensor& image_embeds,
                                   const std::vector<ImageGrid>& grids, bool multimodal_positions) {
  MultimodalInputs r;
  r.image_embeds = image_embeds;
  r.grids = grids;
  r.image_token_id = config.image_token_id;
  r.spatial_merge_size = config.spatial_merge_size;
  r.mrope_section = config.mrope_section;
  r.multimodal_positions = multimodal_positions;
  return r;
}

DecoderLayersNeeded decoder_layers_needed(const DecoderTextEncoderConfig& config,
                                          const std::vector<int64_t>& indices, const std::string& where) {
  const int64_t L = config.num_hidden_layers;
  KILN_CHECK(!indices.empty(), where << ": no hidden state asked of the text encoder");
  int64_t deepest = 0;
  for (int64_t k : indices) {
    KILN_CHECK(k >= 0 && k <= L, where << ": hidden state " << k << " asked, the text encoder has 0.." << L);
    deepest = std::max(deepest, k);
  }
  return {.layers = deepest == L ? L : deepest, .final_norm = deepest == L};
}

std::unique_ptr<DecoderTextEncoder> load_decoder_text_encoder(const std::string& folder, DType dtype,
                                                              const std::vector<int64_t>& indices,
                                                              const nn::TensorParallel& tp) {
  const auto config = DecoderTextEncoderConfig::from_file(folder + "/config.json");
  nn::CheckpointWeights weights(folder);
  return load_decoder_text_encoder(config, weights, dtype, indices, tp);
}

std::unique_ptr<DecoderTextEncoder> load_decoder_text_encoder(const DecoderTextEncoderConfig& config,
                                                              const nn::WeightSource& weights, DType dtype,
                                                              const std::vector<int64_t>& indices,
                                                              const nn::TensorParallel& tp) {
  const int64_t L = config.num_hidden_layers;
  const DecoderLayersNeeded need = decoder_layers_needed(config, indices, weights.description());
  const bool with_norm = need.final_norm;
  auto model = std::make_unique<DecoderTextEncoder>(config, need.layers, with_norm, tp);
  nn::LoadOptions options;
  options.dtype = dtype;
  for (int64_t i = model->num_layers_built(); i < L; ++i)
    options.ignore_prefixes.push_back("layers." + std::to_string(i) + ".");
  if (!with_norm) options.ignore_prefixes.push_back("norm.");
  std::function<std::string(const std::string&)> rename;
  if (config.family == DecoderFamily::Mistral) {
    // save_pretrained's names (language_model.model.*) and the module tree's (model.language_model.*).
    for (const char* p : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                          "model.multi_modal_projector.", "lm_head.", "language_model.lm_head."}) {
      options.ignore_prefixes.push_back(p);
    }
    rename = [](const std::string& name) {
      for (const std::string prefix : {"language_model.model.", "model.language_model."}) {
        if (name.rfind(prefix, 0) == 0) return name.substr(prefix.size());
      }
      return name;
    };
  } else {
    options.ignore_prefixes.push_back("lm_head.");
    // Qwen2.5-VL: the vision tower (visual.*, or model.visual.* in the module tree) is not read here; the
    // language model is model.* as save_pretrained writes it, model.language_model.* in the module tree.
    for (const char* p : {"visual.", "model.visual."}) options.ignore_prefixes.push_back(p);
    rename = [](const std::string& name) {
      for (const std::string prefix : {"model.language_model.", "model."}) {
        if (name.rfind(prefix, 0) == 0) return name.substr(prefix.size());
      }
      return name;
    };
  }
  const nn::RenamedWeights renamed(weights, rename);
  model->load_weights(renamed, options);
  return model;
}

}  // namespace kiln::models
