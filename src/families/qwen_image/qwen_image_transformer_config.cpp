#include <algorithm>
#include <array>
#include <string_view>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/families/qwen_image/qwen_image_transformer.h"
#include "kiln/io/component_config.h"
#include "kiln/io/json_config.h"

namespace kiln::models {

namespace {

// The arguments of diffusers' QwenImageTransformer2DModel.__init__.
constexpr std::array<std::string_view, 12> kKnownKeys = {
    "patch_size",         "in_channels",         "out_channels",          "num_layers",
    "attention_head_dim", "num_attention_heads", "joint_attention_dim",   "guidance_embeds",
    "axes_dims_rope",     "zero_cond_t",         "use_additional_t_cond", "use_layer3d_rope"};

// The flags of the variants whose architecture or inputs Kiln does not have, each with what it belongs to.
struct UnsupportedFlag {
  std::string_view key, what;
};
constexpr std::array<UnsupportedFlag, 3> kUnsupportedFlags = {{
    {"use_additional_t_cond", "Qwen-Image-Layered's (an extra timestep condition embedding)"},
    {"use_layer3d_rope", "Qwen-Image-Layered's (QwenEmbedLayer3DRope)"},
    {"guidance_embeds",
     "a guidance-distilled variant's (diffusers' QwenImageTransformer2DModel has no guidance "
     "embedder to run it with)"},
}};

}  // namespace

QwenImageTransformerConfig QwenImageTransformerConfig::from_config(const io::JsonConfig& f) {
  for (const std::string& key : f.keys()) {
    if (key == "_class_name") {
      KILN_CHECK(
          f.type_of(key) == "string" && f.get<std::string>(key) == "QwenImageTransformer2DModel",
          f.where(key) << " is " << f.dump(key)
                       << ", expected \"QwenImageTransformer2DModel\" (not a Qwen-Image transformer config)");
      continue;
    }
    if (key.rfind('_', 0) == 0) continue;  // _diffusers_version, _name_or_path: provenance only
    // diffusers ignores unknown keys with a warning; here one may come from a variant with another
    // architecture, which this code would run wrongly without a word.
    KILN_CHECK(
        std::find(kKnownKeys.begin(), kKnownKeys.end(), key) != kKnownKeys.end(),
        f.where(key) << " is not a QwenImageTransformer2DModel argument (known: patch_size, in_channels, "
                        "out_channels, num_layers, attention_head_dim, num_attention_heads, "
                        "joint_attention_dim, guidance_embeds, axes_dims_rope, zero_cond_t, "
                        "use_additional_t_cond, use_layer3d_rope)");
  }
  for (const UnsupportedFlag& flag : kUnsupportedFlags) {
    const std::string key(flag.key);
    KILN_CHECK(!f.get_or<bool>(key, false),
               f.where(key) << " is true: " << flag.what
                            << "; Kiln runs the Qwen-Image / Qwen-Image-Edit(-2509, -2511) transformer, "
                               "where it is false");
  }
  QwenImageTransformerConfig c;
  c.patch_size = f.get_or<int64_t>("patch_size", c.patch_size);
  c.in_channels = f.get_or<int64_t>("in_channels", c.in_channels);
  // diffusers: out_channels or in_channels (null and 0 alike); absent, the default 16.
  if (f.type_of("out_channels") == "null")
    c.out_channels = c.in_channels;
  else
    c.out_channels = f.get_or<int64_t>("out_channels", c.out_channels);
  if (c.out_channels == 0) c.out_channels = c.in_channels;
  c.num_layers = f.get_or<int64_t>("num_layers", c.num_layers);
  c.attention_head_dim = f.get_or<int64_t>("attention_head_dim", c.attention_head_dim);
  c.num_attention_heads = f.get_or<int64_t>("num_attention_heads", c.num_attention_heads);
  c.joint_attention_dim = f.get_or<int64_t>("joint_attention_dim", c.joint_attention_dim);
  c.guidance_embeds = f.get_or<bool>("guidance_embeds", c.guidance_embeds);
  c.axes_dims_rope = f.get_or<std::vector<int64_t>>("axes_dims_rope", c.axes_dims_rope);
  c.zero_cond_t = f.get_or<bool>("zero_cond_t", c.zero_cond_t);
  c.validate(f.origin());
  return c;
}

QwenImageTransformerConfig QwenImageTransformerConfig::from_json(const std::string& text,
                                                                 const std::string& source) {
  return from_config(io::JsonConfig::parse(text, source));
}

QwenImageTransformerConfig QwenImageTransformerConfig::from_file(const std::string& folder_or_config_json) {
  return from_config(io::JsonConfig::load(io::config_file_in(folder_or_config_json, "config.json")));
}

void QwenImageTransformerConfig::validate(const std::string& source) const {
  // First the sizes alone, so that no product below can overflow and no model of absurd size is built.
  using limits::kMaxLayers, limits::kMaxWidth;
  limits::check_config(source, {{"num_layers", num_layers, kMaxLayers},
                                {"patch_size", patch_size, 16},
                                {"in_channels", in_channels, kMaxWidth},
                                {"out_channels", out_channels, kMaxWidth},
                                {"attention_head_dim", attention_head_dim, kMaxWidth},
                                {"num_attention_heads", num_attention_heads, kMaxWidth},
                                {"joint_attention_dim", joint_attention_dim, kMaxWidth}});
  const std::pair<const char*, int64_t> positive[] = {{"patch_size", patch_size},
                                                      {"in_channels", in_channels},
                                                      {"out_channels", out_channels},
                                                      {"attention_head_dim", attention_head_dim},
                                                      {"num_attention_heads", num_attention_heads},
                                                      {"joint_attention_dim", joint_attention_dim}};
  for (const auto& [name, value] : positive)
    KILN_CHECK(value > 0, source << ": " << name << " must be positive, got " << value);
  KILN_CHECK(num_layers >= 0, source << ": num_layers must not be negative, got " << num_layers);
  // Both factors are now in 1..kMaxWidth, so the products cannot overflow.
  limits::check_config(source,
                       {{"num_attention_heads * attention_head_dim", inner_dim(), kMaxWidth},
                        {"patch_size^2 * out_channels", patch_size * patch_size * out_channels, kMaxWidth}});
  KILN_CHECK(!guidance_embeds,
             source << ": guidance_embeds is true, which diffusers' QwenImageTransformer2DModel "
                       "cannot run (it has no guidance embedder)");
  KILN_CHECK(
      axes_dims_rope.size() == 3,
      source << ": axes_dims_rope must hold 3 values (frame, height, width), got " << axes_dims_rope.size());
  int64_t rope_dims = 0;
  for (int64_t d : axes_dims_rope) {
    KILN_CHECK(
        d > 0 && d % 2 == 0 && d <= kMaxWidth,
        source << ": every entry of axes_dims_rope must be positive and even (rotated pairs) and at most "
               << kMaxWidth << ", got " << d);
    rope_dims += d;
  }
  KILN_CHECK(rope_dims == attention_head_dim,
             source << ": axes_dims_rope adds up to " << rope_dims
                    << " but the rotary embedding covers the whole head, attention_head_dim = "
                    << attention_head_dim);
}

}  // namespace kiln::models
