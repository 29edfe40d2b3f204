#include <algorithm>
#include <array>
#include <string_view>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/families/z_image/z_image_transformer.h"
#include "kiln/io/component_config.h"

namespace kiln::models {

namespace {

// The arguments of diffusers' ZImageTransformer2DModel.__init__ that Kiln runs (siglip_feat_dim aside).
constexpr std::array<std::string_view, 15> kKnownKeys = {
    "all_patch_size",   "all_f_patch_size", "in_channels", "dim",       "n_layers",
    "n_refiner_layers", "n_heads",          "n_kv_heads",  "norm_eps",  "qk_norm",
    "cap_feat_dim",     "rope_theta",       "t_scale",     "axes_dims", "axes_lens"};

}  // namespace

int64_t ZImageTransformerConfig::ffn_hidden() const {
  // int(dim / 3 * 8): Python's float arithmetic, truncated.
  return static_cast<int64_t>(static_cast<double>(dim) / 3.0 * 8.0);
}

ZImageTransformerConfig ZImageTransformerConfig::from_config(const io::JsonConfig& f) {
  for (const std::string& key : f.keys()) {
    if (key == "_class_name") {
      KILN_CHECK(
          f.type_of(key) == "string" && f.get<std::string>(key) == "ZImageTransformer2DModel",
          f.where(key) << " is " << f.dump(key)
                       << ", expected \"ZImageTransformer2DModel\" (not a Z-Image transformer config)");
      continue;
    }
    if (key.rfind('_', 0) == 0) continue;  // provenance only
    if (key == "siglip_feat_dim") {
      KILN_CHECK(
          f.type_of(key) == "null",
          f.where(key) << " is " << f.dump(key)
                       << ": a Z-Image Omni transformer (SigLIP image features; ZImageOmniPipeline), which "
                          "Kiln does not run yet");
      continue;
    }
    KILN_CHECK(std::find(kKnownKeys.begin(), kKnownKeys.end(), key) != kKnownKeys.end(),
               f.where(key) << " is not a ZImageTransformer2DModel argument (known: all_patch_size, "
                               "all_f_patch_size, in_channels, dim, n_layers, n_refiner_layers, n_heads, "
                               "n_kv_heads, norm_eps, qk_norm, cap_feat_dim, rope_theta, t_scale, axes_dims, "
                               "axes_lens)");
  }
  ZImageTransformerConfig c;
  c.all_patch_size = f.get_or<std::vector<int64_t>>("all_patch_size", c.all_patch_size);
  c.all_f_patch_size = f.get_or<std::vector<int64_t>>("all_f_patch_size", c.all_f_patch_size);
  c.in_channels = f.get_or<int64_t>("in_channels", c.in_channels);
  c.dim = f.get_or<int64_t>("dim", c.dim);
  c.n_layers = f.get_or<int64_t>("n_layers", c.n_layers);
  c.n_refiner_layers = f.get_or<int64_t>("n_refiner_layers", c.n_refiner_layers);
  c.n_heads = f.get_or<int64_t>("n_heads", c.n_heads);
  c.n_kv_heads = f.get_or<int64_t>("n_kv_heads", c.n_kv_heads);
  c.norm_eps = f.get_or<double>("norm_eps", c.norm_eps);
  c.qk_norm = f.get_or<bool>("qk_norm", c.qk_norm);
  c.cap_feat_dim = f.get_or<int64_t>("cap_feat_dim", c.cap_feat_dim);
  c.rope_theta = f.get_or<double>("rope_theta", c.rope_theta);
  c.t_scale = f.get_or<double>("t_scale", c.t_scale);
  c.axes_dims = f.get_or<std::vector<int64_t>>("axes_dims", c.axes_dims);
  c.axes_lens = f.get_or<std::vector<int64_t>>("axes_lens", c.axes_lens);
  c.validate(f.origin());
  return c;
}

ZImageTransformerConfig ZImageTransformerConfig::from_json(const std::string& text,
                                                           const std::string& source) {
  return from_config(io::JsonConfig::parse(text, source));
}

ZImageTransformerConfig ZImageTransformerConfig::from_file(const std::string& path) {
  return from_config(io::JsonConfig::load(io::config_file_in(path, "config.json")));
}

void ZImageTransformerConfig::validate(const std::string& source) const {
  limits::check_config(source, {{"dim", dim, limits::kMaxWidth},
                                {"in_channels", in_channels, limits::kMaxWidth},
                                {"cap_feat_dim", cap_feat_dim, limits::kMaxWidth},
                                {"n_heads", n_heads, limits::kMaxWidth},
                                {"n_layers", n_layers, limits::kMaxLayers},
                                {"n_refiner_layers", n_refiner_layers, limits::kMaxLayers}});
  // The text-to-image pipelines use one patch size: the first (and in every released config, only) one.
  KILN_CHECK(
      all_patch_size.size() == 1 && all_f_patch_size.size() == 1 && all_patch_size[0] > 0 &&
          all_patch_size[0] <= 16 && all_f_patch_size[0] == 1,
      source << ": all_patch_size and all_f_patch_size must each hold one size (the spatial one 1..16, the "
                "temporal one 1), got "
             << all_patch_size.size() << " and " << all_f_patch_size.size() << " sizes");
  KILN_CHECK(dim > 0 && n_heads > 0 && dim % n_heads == 0,
             source << ": dim (" << dim << ") must be a positive multiple of n_heads (" << n_heads << ")");
  KILN_CHECK(n_kv_heads == n_heads, source << ": n_kv_heads (" << n_kv_heads << ") must equal n_heads ("
                                           << n_heads
                                           << "): diffusers' Z-Image attention has no grouped keys");
  KILN_CHECK(
      in_channels > 0 && cap_feat_dim > 0 && n_layers >= 0 && n_refiner_layers >= 0,
      source
          << ": in_channels and cap_feat_dim must be positive, n_layers and n_refiner_layers not negative");
  KILN_CHECK(norm_eps > 0, source << ": norm_eps must be positive, got " << norm_eps);
  KILN_CHECK(axes_dims.size() == 3 && axes_lens.size() == 3,
             source << ": axes_dims and axes_lens must hold 3 values (caption/frame, height, width), got "
                    << axes_dims.size() << " and " << axes_lens.size());
  int64_t rope = 0;
  for (size_t i = 0; i < 3; ++i) {
    KILN_CHECK(axes_dims[i] > 0 && axes_dims[i] % 2 == 0 && axes_lens[i] > 0 &&
                   axes_lens[i] <= limits::kMaxPositions,
               source << ": axes_dims must be positive and even and axes_lens positive (axis " << i << ": "
                      << axes_dims[i] << ", " << axes_lens[i] << ")");
    rope += axes_dims[i];
  }
  KILN_CHECK(rope == head_dim(), source << ": axes_dims sum to " << rope
                                        << " but the head dim (dim / n_heads) is " << head_dim());
  KILN_CHECK(rope_theta > 0 && t_scale > 0, source << ": rope_theta and t_scale must be positive");
}

}  // namespace kiln::models
