#include <algorithm>
#include <array>
#include <string_view>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/io/component_config.h"
#include "kiln/io/json_config.h"
#include "kiln/models/sd3_transformer.h"

namespace kiln::models {

namespace {

// The arguments of diffusers' SD3Transformer2DModel.__init__.
constexpr std::array<std::string_view, 13> kKnownKeys = {"sample_size",
                                                         "patch_size",
                                                         "in_channels",
                                                         "num_layers",
                                                         "attention_head_dim",
                                                         "num_attention_heads",
                                                         "joint_attention_dim",
                                                         "caption_projection_dim",
                                                         "pooled_projection_dim",
                                                         "out_channels",
                                                         "pos_embed_max_size",
                                                         "dual_attention_layers",
                                                         "qk_norm"};

}  // namespace

bool SD3TransformerConfig::is_dual_attention_layer(int64_t block) const {
  return std::find(dual_attention_layers.begin(), dual_attention_layers.end(), block) !=
         dual_attention_layers.end();
}

SD3TransformerConfig SD3TransformerConfig::from_config(const io::JsonConfig& f) {
  // diffusers drops the keys listed in _use_default_values and uses the class defaults for them.
  std::vector<std::string> use_defaults;
  if (f.has("_use_default_values")) use_defaults = f.get<std::vector<std::string>>("_use_default_values");
  auto defaulted = [&](const std::string& key) {
    return std::find(use_defaults.begin(), use_defaults.end(), key) != use_defaults.end();
  };
  for (const std::string& key : f.keys()) {
    if (key == "_class_name") {
      KILN_CHECK(f.type_of(key) == "string" && f.get<std::string>(key) == "SD3Transformer2DModel",
                 f.where(key) << " is " << f.dump(key)
                              << ", expected \"SD3Transformer2DModel\" (not an SD3 transformer config)");
      continue;
    }
    if (key.rfind('_', 0) == 0) continue;  // _diffusers_version, _name_or_path: provenance only
    // diffusers ignores unknown keys with a warning; one may come from a variant with another architecture,
    // and running that with this code would silently give wrong results.
    KILN_CHECK(
        std::find(kKnownKeys.begin(), kKnownKeys.end(), key) != kKnownKeys.end(),
        f.where(key) << " is not an SD3Transformer2DModel argument (known: sample_size, patch_size, "
                        "in_channels, num_layers, attention_head_dim, num_attention_heads, "
                        "joint_attention_dim, caption_projection_dim, pooled_projection_dim, out_channels, "
                        "pos_embed_max_size, dual_attention_layers, qk_norm)");
  }
  SD3TransformerConfig c;
  auto read = [&](const char* key, int64_t& field) {
    if (!defaulted(key)) field = f.get_or<int64_t>(key, field);
  };
  read("sample_size", c.sample_size);
  read("patch_size", c.patch_size);
  read("in_channels", c.in_channels);
  read("num_layers", c.num_layers);
  read("attention_head_dim", c.attention_head_dim);
  read("num_attention_heads", c.num_attention_heads);
  read("joint_attention_dim", c.joint_attention_dim);
  read("caption_projection_dim", c.caption_projection_dim);
  read("pooled_projection_dim", c.pooled_projection_dim);
  read("pos_embed_max_size", c.pos_embed_max_size);
  // "out_channels": null means in_channels (diffusers: out_channels if out_channels is not None else
  // in_channels).
  if (!defaulted("out_channels"))
    c.out_channels =
        f.contains("out_channels") ? f.get_or<int64_t>("out_channels", c.in_channels) : c.out_channels;
  if (!defaulted("dual_attention_layers"))
    c.dual_attention_layers = f.get_or<std::vector<int64_t>>("dual_attention_layers", {});
  if (!defaulted("qk_norm")) c.qk_norm = f.get_or<std::string>("qk_norm", "");
  c.validate(f.origin());
  return c;
}

SD3TransformerConfig SD3TransformerConfig::from_json(const std::string& text, const std::string& source) {
  return from_config(io::JsonConfig::parse(text, source));
}

SD3TransformerConfig SD3TransformerConfig::from_file(const std::string& path) {
  return from_config(io::JsonConfig::load(io::config_file_in(path, "config.json")));
}

void SD3TransformerConfig::validate(const std::string& source) const {
  // First the sizes alone, so that no product below can overflow and no model of absurd size is built.
  using limits::kMaxLayers, limits::kMaxPositions, limits::kMaxWidth;
  limits::check_config(source, {{"sample_size", sample_size, kMaxPositions},
                                {"patch_size", patch_size, 64},
                                {"in_channels", in_channels, kMaxWidth},
                                {"num_layers", num_layers, kMaxLayers},
                                {"attention_head_dim", attention_head_dim, kMaxWidth},
                                {"num_attention_heads", num_attention_heads, kMaxWidth},
                                {"joint_attention_dim", joint_attention_dim, kMaxWidth},
                                {"caption_projection_dim", caption_projection_dim, kMaxWidth},
                                {"pooled_projection_dim", pooled_projection_dim, kMaxWidth},
                                {"out_channels", out_channels, kMaxWidth},
                                {"pos_embed_max_size", pos_embed_max_size, 4096}});
  const std::pair<const char*, int64_t> positive[] = {{"sample_size", sample_size},
                                                      {"patch_size", patch_size},
                                                      {"in_channels", in_channels},
                                                      {"num_layers", num_layers},
                                                      {"attention_head_dim", attention_head_dim},
                                                      {"num_attention_heads", num_attention_heads},
                                                      {"joint_attention_dim", joint_attention_dim},
                                                      {"caption_projection_dim", caption_projection_dim},
                                                      {"pooled_projection_dim", pooled_projection_dim},
                                                      {"out_channels", out_channels},
                                                      {"pos_embed_max_size", pos_embed_max_size}};
  for (const auto& [name, value] : positive)
    KILN_CHECK(value > 0, source << ": " << name << " must be positive, got " << value);
  // Both factors are now in 1..kMaxWidth, so the product cannot overflow.
  limits::check_config(source, {{"num_attention_heads * attention_head_dim",
                                 num_attention_heads * attention_head_dim, kMaxWidth}});
  // The context stream enters the joint attention through projections of width inner_dim (added_kv_proj_dim =
  // dim in diffusers), so the context embedder must produce exactly that width.
  KILN_CHECK(caption_projection_dim == inner_dim(),
             source << ": caption_projection_dim " << caption_projection_dim
                    << " must equal num_attention_heads * attention_head_dim = " << inner_dim()
                    << " (the context stream shares the blocks' width)");
  KILN_CHECK(
      qk_norm.empty() || qk_norm == "rms_norm",
      source << ": qk_norm \"" << qk_norm << "\" is not supported (SD3 models use null or \"rms_norm\")");
  for (int64_t i : dual_attention_layers)
    KILN_CHECK(i >= 0 && i < num_layers, source << ": dual_attention_layers holds " << i
                                                << ", outside the model's blocks 0.." << num_layers - 1);
}

}  // namespace kiln::models
