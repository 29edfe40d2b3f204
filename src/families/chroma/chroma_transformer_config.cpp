#include <algorithm>
#include <array>
#include <string_view>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/families/chroma/chroma_transformer.h"
#include "kiln/io/component_config.h"
#include "kiln/models/flux_transformer.h"

namespace kiln::models {

namespace {

// The arguments of diffusers' ChromaTransformer2DModel.__init__.
constexpr std::array<std::string_view, 12> kKnownKeys = {"patch_size",
                                                         "in_channels",
                                                         "out_channels",
                                                         "num_layers",
                                                         "num_single_layers",
                                                         "attention_head_dim",
                                                         "num_attention_heads",
                                                         "joint_attention_dim",
                                                         "axes_dims_rope",
                                                         "approximator_num_channels",
                                                         "approximator_hidden_dim",
                                                         "approximator_layers"};

}  // namespace

FluxTransformerConfig ChromaTransformerConfig::backbone() const {
  FluxTransformerConfig c;
  c.patch_size = patch_size;
  c.in_channels = in_channels;
  c.out_channels = out_channels;
  c.num_layers = num_layers;
  c.num_single_layers = num_single_layers;
  c.attention_head_dim = attention_head_dim;
  c.num_attention_heads = num_attention_heads;
  c.joint_attention_dim = joint_attention_dim;
  c.axes_dims_rope = axes_dims_rope;
  return c;
}

ChromaTransformerConfig ChromaTransformerConfig::from_config(const io::JsonConfig& f) {
  for (const std::string& key : f.keys()) {
    if (key == "_class_name") {
      KILN_CHECK(f.type_of(key) == "string" && f.get<std::string>(key) == "ChromaTransformer2DModel",
                 f.where(key) << " is " << f.dump(key)
                              << ", expected \"ChromaTransformer2DModel\" (not a Chroma transformer config)");
      continue;
    }
    if (key.rfind('_', 0) == 0) continue;  // provenance only
    KILN_CHECK(std::find(kKnownKeys.begin(), kKnownKeys.end(), key) != kKnownKeys.end(),
               f.where(key) << " is not a ChromaTransformer2DModel argument (known: patch_size, in_channels, "
                               "out_channels, num_layers, num_single_layers, attention_head_dim, "
                               "num_attention_heads, joint_attention_dim, axes_dims_rope, "
                               "approximator_num_channels, approximator_hidden_dim, approximator_layers)");
  }
  ChromaTransformerConfig c;
  c.patch_size = f.get_or<int64_t>("patch_size", c.patch_size);
  c.in_channels = f.get_or<int64_t>("in_channels", c.in_channels);
  c.out_channels = f.get_or<int64_t>("out_channels", c.in_channels);  // null: out_channels = in_channels
  c.num_layers = f.get_or<int64_t>("num_layers", c.num_layers);
  c.num_single_layers = f.get_or<int64_t>("num_single_layers", c.num_single_layers);
  c.attention_head_dim = f.get_or<int64_t>("attention_head_dim", c.attention_head_dim);
  c.num_attention_heads = f.get_or<int64_t>("num_attention_heads", c.num_attention_heads);
  c.joint_attention_dim = f.get_or<int64_t>("joint_attention_dim", c.joint_attention_dim);
  c.axes_dims_rope = f.get_or<std::vector<int64_t>>("axes_dims_rope", c.axes_dims_rope);
  c.approximator_num_channels = f.get_or<int64_t>("approximator_num_channels", c.approximator_num_channels);
  c.approximator_hidden_dim = f.get_or<int64_t>("approximator_hidden_dim", c.approximator_hidden_dim);
  c.approximator_layers = f.get_or<int64_t>("approximator_layers", c.approximator_layers);
  c.validate(f.origin());
  return c;
}

ChromaTransformerConfig ChromaTransformerConfig::from_json(const std::string& text,
                                                           const std::string& source) {
  return from_config(io::JsonConfig::parse(text, source));
}

ChromaTransformerConfig ChromaTransformerConfig::from_file(const std::string& path) {
  return from_config(io::JsonConfig::load(io::config_file_in(path, "config.json")));
}

void ChromaTransformerConfig::validate(const std::string& source) const {
  backbone().validate(source);  // the blocks' rules are FLUX.1's
  limits::check_config(source, {{"approximator_hidden_dim", approximator_hidden_dim, limits::kMaxWidth},
                                {"approximator_num_channels", approximator_num_channels, limits::kMaxWidth},
                                {"approximator_layers", approximator_layers, limits::kMaxLayers}});
  KILN_CHECK(approximator_hidden_dim > 0 && approximator_layers >= 0,
             source << ": approximator_hidden_dim must be positive and approximator_layers not negative, got "
                    << approximator_hidden_dim << " and " << approximator_layers);
  // Its input is [timestep sinusoid (C), guidance sinusoid (C), modulation index sinusoid (2C)], C even.
  KILN_CHECK(approximator_num_channels > 0 && approximator_num_channels % 8 == 0,
             source << ": approximator_num_channels must be a positive multiple of 8 (four even-width "
                       "sinusoid quarters), got "
                    << approximator_num_channels);
}

}  // namespace kiln::models
