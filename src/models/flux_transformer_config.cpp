#include <algorithm>
#include <array>
#include <string_view>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/io/component_config.h"
#include "kiln/io/json_config.h"
#include "kiln/models/flux_transformer.h"

namespace kiln::models {

namespace {

// The arguments of diffusers' FluxTransformer2DModel.__init__.
constexpr std::array<std::string_view, 11> kKnownKeys = {
    "patch_size",          "in_channels",         "out_channels",
    "num_layers",          "num_single_layers",   "attention_head_dim",
    "num_attention_heads", "joint_attention_dim", "pooled_projection_dim",
    "guidance_embeds",     "axes_dims_rope"};

}  // namespace

FluxTransformerConfig FluxTransformerConfig::from_config(const io::JsonConfig& f) {
  for (const std::string& key : f.keys()) {
    if (key == "_class_name") {
      KILN_CHECK(f.type_of(key) == "string" && f.get<std::string>(key) == "FluxTransformer2DModel",
                 f.where(key) << " is " << f.dump(key)
                              << ", expected \"FluxTransformer2DModel\" (not a FLUX.1 transformer config)");
      continue;
    }
    if (key.rfind('_', 0) == 0) continue;  // _diffusers_version, _name_or_path: provenance only
    // diffusers ignores unknown keys with a warning; here one may come from a variant with another
    // architecture, and running that with this code would silently give wrong results.
    KILN_CHECK(
        std::find(kKnownKeys.begin(), kKnownKeys.end(), key) != kKnownKeys.end(),
        f.where(key) << " is not a FluxTransformer2DModel argument (known: patch_size, in_channels, "
                        "out_channels, num_layers, num_single_layers, attention_head_dim, "
                        "num_attention_heads, joint_attention_dim, pooled_projection_dim, guidance_embeds, "
                        "axes_dims_rope)");
  }
  FluxTransformerConfig c;
  c.patch_size = f.get_or<int64_t>("patch_size", c.patch_size);
  c.in_channels = f.get_or<int64_t>("in_channels", c.in_channels);
  c.out_channels = f.get_or<int64_t>("out_channels", c.in_channels);  // null: out_channels = in_channels
  c.num_layers = f.get_or<int64_t>("num_layers", c.num_layers);
  c.num_single_layers = f.get_or<int64_t>("num_single_layers", c.num_single_layers);
  c.attention_head_dim = f.get_or<int64_t>("attention_head_dim", c.attention_head_dim);
  c.num_attention_heads = f.get_or<int64_t>("num_attention_heads", c.num_attention_heads);
  c.joint_attention_dim = f.get_or<int64_t>("joint_attention_dim", c.joint_attention_dim);
  c.pooled_projection_dim = f.get_or<int64_t>("pooled_projection_dim", c.pooled_projection_dim);
  c.guidance_embeds = f.get_or<bool>("guidance_embeds", c.guidance_embeds);
  c.axes_dims_rope = f.get_or<std::vector<int64_t>>("axes_dims_rope", c.axes_dims_rope);
  c.validate(f.origin());
  return c;
}

FluxTransformerConfig FluxTransformerConfig::from_json(const std::string& text, const std::string& source) {
  return from_config(io::JsonConfig::parse(text, source));
}

FluxTransformerConfig FluxTransformerConfig::from_file(const std::string& path) {
  return from_config(io::JsonConfig::load(io::config_file_in(path, "config.json")));
}

void FluxTransformerConfig::validate(const std::string& source) const {
  // First the sizes alone, so that no product below can overflow and no model of absurd size is built.
  using limits::kMaxLayers, limits::kMaxWidth;
  limits::check_config(source,
                       {{"num_layers", num_layers, kMaxLayers},
                        {"num_single_layers", num_single_layers, kMaxLayers},
                        {"in_channels", in_channels, kMaxWidth},
                        {"out_channels", out_channels, kMaxWidth},
                        {"attention_head_dim", attention_head_dim, kMaxWidth},
                        {"num_attention_heads", num_attention_heads, kMaxWidth},
                        {"joint_attention_dim", joint_attention_dim, kMaxWidth},
                        {"pooled_projection_dim", pooled_projection_dim, kMaxWidth},
                        {"the number of axes_dims_rope", static_cast<int64_t>(axes_dims_rope.size()), 16}});
  KILN_CHECK(patch_size == 1,
             source << ": patch_size " << patch_size
                    << " is not supported (FluxTransformer2DModel uses patch_size 1; the pipeline "
                       "packs 2x2 latent patches itself)");
  const std::pair<const char*, int64_t> positive[] = {{"in_channels", in_channels},
                                                      {"out_channels", out_channels},
                                                      {"attention_head_dim", attention_head_dim},
                                                      {"num_attention_heads", num_attention_heads},
                                                      {"joint_attention_dim", joint_attention_dim},
                                                      {"pooled_projection_dim", pooled_projection_dim}};
  for (const auto& [name, value] : positive)
    KILN_CHECK(value > 0, source << ": " << name << " must be positive, got " << value);
  // Both factors are now in 1..kMaxWidth, so the product cannot overflow.
  limits::check_config(source, {{"num_attention_heads * attention_head_dim",
                                 num_attention_heads * attention_head_dim, kMaxWidth}});
  KILN_CHECK(num_layers >= 0 && num_single_layers >= 0,
             source << ": num_layers and num_single_layers must not be negative, got " << num_layers
                    << " and " << num_single_layers);
  KILN_CHECK(!axes_dims_rope.empty(), source << ": axes_dims_rope is empty");
  int64_t rope_dims = 0;
  for (int64_t d : axes_dims_rope) {
    KILN_CHECK(
        d > 0 && d % 2 == 0 && d <= limits::kMaxWidth,
        source << ": every entry of axes_dims_rope must be positive and even (rotated pairs) and at most "
               << limits::kMaxWidth << ", got " << d);
    rope_dims += d;
  }
  KILN_CHECK(rope_dims == attention_head_dim,
             source << ": axes_dims_rope adds up to " << rope_dims
                    << " but the rotary embedding covers the whole head, attention_head_dim = "
                    << attention_head_dim);
}

}  // namespace kiln::models
