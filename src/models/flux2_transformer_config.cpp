#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/io/component_config.h"
#include "kiln/io/json_config.h"
#include "kiln/models/flux2_transformer.h"

namespace kiln::models {

namespace {

// The arguments of diffusers' Flux2Transformer2DModel.__init__.
constexpr std::array<std::string_view, 14> kKnownKeys = {"patch_size",
                                                         "in_channels",
                                                         "out_channels",
                                                         "num_layers",
                                                         "num_single_layers",
                                                         "attention_head_dim",
                                                         "num_attention_heads",
                                                         "joint_attention_dim",
                                                         "timestep_guidance_channels",
                                                         "mlp_ratio",
                                                         "axes_dims_rope",
                                                         "rope_theta",
                                                         "eps",
                                                         "guidance_embeds"};

// Larger than any real model by orders of magnitude (kiln/core/limits.h); a config beyond them is corrupt,
// and refusing it here keeps a bad file from asking for absurd allocations later.
using limits::kMaxLayers;
using limits::kMaxWidth;

}  // namespace

int64_t Flux2TransformerConfig::mlp_hidden_dim() const {
  // Python's int(dim * mlp_ratio): the float product truncated.
  return static_cast<int64_t>(static_cast<double>(inner_dim()) * mlp_ratio);
}

Flux2TransformerConfig Flux2TransformerConfig::from_config(const io::JsonConfig& f) {
  for (const std::string& key : f.keys()) {
    if (key == "_class_name") {
      KILN_CHECK(f.type_of(key) == "string" && f.get<std::string>(key) == "Flux2Transformer2DModel",
                 f.where(key) << " is " << f.dump(key)
                              << ", expected \"Flux2Transformer2DModel\" (not a FLUX.2 transformer config)");
      continue;
    }
    if (key.rfind('_', 0) == 0) continue;  // _diffusers_version, _name_or_path: provenance only
    // diffusers ignores unknown keys with a warning; one may come from a variant with another architecture,
    // and running that with this code would silently give wrong results.
    KILN_CHECK(std::find(kKnownKeys.begin(), kKnownKeys.end(), key) != kKnownKeys.end(),
               f.where(key) << " is not a Flux2Transformer2DModel argument (known: patch_size, in_channels, "
                               "out_channels, num_layers, num_single_layers, attention_head_dim, "
                               "num_attention_heads, joint_attention_dim, timestep_guidance_channels, "
                               "mlp_ratio, axes_dims_rope, rope_theta, eps, guidance_embeds)");
  }
  Flux2TransformerConfig c;
  c.patch_size = f.get_or<int64_t>("patch_size", c.patch_size);
  c.in_channels = f.get_or<int64_t>("in_channels", c.in_channels);
  c.out_channels = f.get_or<int64_t>("out_channels", c.in_channels);  // null: out_channels = in_channels
  c.num_layers = f.get_or<int64_t>("num_layers", c.num_layers);
  c.num_single_layers = f.get_or<int64_t>("num_single_layers", c.num_single_layers);
  c.attention_head_dim = f.get_or<int64_t>("attention_head_dim", c.attention_head_dim);
  c.num_attention_heads = f.get_or<int64_t>("num_attention_heads", c.num_attention_heads);
  c.joint_attention_dim = f.get_or<int64_t>("joint_attention_dim", c.joint_attention_dim);
  c.timestep_guidance_channels =
      f.get_or<int64_t>("timestep_guidance_channels", c.timestep_guidance_channels);
  c.mlp_ratio = f.get_or<double>("mlp_ratio", c.mlp_ratio);
  c.axes_dims_rope = f.get_or<std::vector<int64_t>>("axes_dims_rope", c.axes_dims_rope);
  c.rope_theta = f.get_or<double>("rope_theta", c.rope_theta);
  c.eps = f.get_or<double>("eps", c.eps);
  c.guidance_embeds = f.get_or<bool>("guidance_embeds", c.guidance_embeds);
  c.validate(f.origin());
  return c;
}

Flux2TransformerConfig Flux2TransformerConfig::from_json(const std::string& text, const std::string& source) {
  return from_config(io::JsonConfig::parse(text, source));
}

Flux2TransformerConfig Flux2TransformerConfig::from_file(const std::string& path) {
  return from_config(io::JsonConfig::load(io::config_file_in(path, "config.json")));
}

void Flux2TransformerConfig::validate(const std::string& source) const {
  KILN_CHECK(patch_size == 1,
             source << ": patch_size " << patch_size
                    << " is not supported (Flux2Transformer2DModel uses patch_size 1; the pipeline "
                       "patchifies 2x2 latent patches itself)");
  const std::pair<const char*, int64_t> widths[] = {
      {"in_channels", in_channels},
      {"out_channels", out_channels},
      {"attention_head_dim", attention_head_dim},
      {"num_attention_heads", num_attention_heads},
      {"joint_attention_dim", joint_attention_dim},
      {"timestep_guidance_channels", timestep_guidance_channels}};
  for (const auto& [name, value] : widths)
    KILN_CHECK(value > 0 && value <= kMaxWidth,
               source << ": " << name << " must be between 1 and " << kMaxWidth << ", got " << value);
  KILN_CHECK(timestep_guidance_channels % 2 == 0,
             source << ": timestep_guidance_channels must be even (cos and sin halves), got "
                    << timestep_guidance_channels);
  KILN_CHECK(inner_dim() <= kMaxWidth, source << ": num_attention_heads * attention_head_dim = "
                                              << inner_dim() << " exceeds " << kMaxWidth);
  KILN_CHECK(num_layers >= 0 && num_layers <= kMaxLayers && num_single_layers >= 0 &&
                 num_single_layers <= kMaxLayers,
             source << ": num_layers and num_single_layers must be between 0 and " << kMaxLayers << ", got "
                    << num_layers << " and " << num_single_layers);
  KILN_CHECK(std::isfinite(mlp_ratio) && mlp_ratio > 0 && mlp_ratio <= 64,
             source << ": mlp_ratio must be in (0, 64], got " << mlp_ratio);
  KILN_CHECK(mlp_hidden_dim() > 0, source << ": mlp_ratio " << mlp_ratio << " leaves no MLP width");
  KILN_CHECK(std::isfinite(rope_theta) && rope_theta > 0,
             source << ": rope_theta must be positive, got " << rope_theta);
  KILN_CHECK(std::isfinite(eps) && eps > 0 && eps < 1, source << ": eps must be in (0, 1), got " << eps);
  KILN_CHECK(!axes_dims_rope.empty(), source << ": axes_dims_rope is empty");
  int64_t rope_dims = 0;
  for (int64_t d : axes_dims_rope) {
    KILN_CHECK(
        d > 0 && d <= kMaxWidth && d % 2 == 0,
        source << ": every entry of axes_dims_rope must be positive and even (rotated pairs), got " << d);
    rope_dims += d;
  }
  KILN_CHECK(rope_dims == attention_head_dim,
             source << ": axes_dims_rope adds up to " << rope_dims
                    << " but the rotary embedding covers the whole head, attention_head_dim = "
                    << attention_head_dim);
}

}  // namespace kiln::models
