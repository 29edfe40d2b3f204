// AutoencoderKLQwenImageConfig: vae/config.json, every argument of diffusers'
// AutoencoderKLQwenImage.__init__.
#include <algorithm>
#include <array>
#include <string_view>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/families/qwen_image/autoencoder_kl_qwen_image.h"
#include "kiln/io/json_config.h"

namespace kiln::models {

namespace {

constexpr std::array<std::string_view, 10> kKeys = {
    "base_dim", "z_dim",          "dim_mult",     "num_res_blocks", "attn_scales", "temperal_downsample",
    "dropout",  "input_channels", "latents_mean", "latents_std"};

// diffusers' defaults (Qwen-Image's statistics), used when the config leaves them out.
const std::vector<double> kLatentsMean = {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,
                                          -0.1517, 1.5508,  0.4134,  -0.0715, 0.5517,  -0.3632,
                                          -0.1922, -0.9497, 0.2503,  -0.2921};
const std::vector<double> kLatentsStd = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                                         3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160};

// A JSON array of booleans (JsonConfig reads no bool lists): its compact dump, "[false,true,true]".
std::vector<bool> bool_list(const io::JsonConfig& f, const std::string& key) {
  const std::string text = f.dump(key);
  KILN_CHECK(text.size() >= 2 && text.front() == '[' && text.back() == ']',
             f.where(key) << " is " << text << ", expected a list of booleans");
  std::vector<bool> values;
  std::string_view rest(text);
  rest = rest.substr(1, rest.size() - 2);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    KILN_CHECK(item == "true" || item == "false", f.where(key)
                                                      << " is " << text << ", expected a list of booleans");
    values.push_back(item == "true");
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return values;
}

AutoencoderKLQwenImageConfig from_config(const io::JsonConfig& f) {
  for (const std::string& key : f.keys()) {
    if (key == "_class_name") {
      KILN_CHECK(f.type_of(key) == "string" && f.get<std::string>(key) == "AutoencoderKLQwenImage",
                 f.where(key) << " is " << f.dump(key) << ", expected \"AutoencoderKLQwenImage\"");
      continue;
    }
    if (key.rfind('_', 0) == 0) continue;  // provenance only
    KILN_CHECK(std::find(kKeys.begin(), kKeys.end(), key) != kKeys.end(),
               f.where(key) << " is not an AutoencoderKLQwenImage argument Kiln knows");
  }
  AutoencoderKLQwenImageConfig c;
  c.base_dim = f.get_or<int64_t>("base_dim", c.base_dim);
  c.z_dim = f.get_or<int64_t>("z_dim", c.z_dim);
  c.dim_mult = f.get_or<std::vector<int64_t>>("dim_mult", c.dim_mult);
  c.num_res_blocks = f.get_or<int64_t>("num_res_blocks", c.num_res_blocks);
  c.attn_scales = f.get_or<std::vector<double>>("attn_scales", {});
  if (f.has("temperal_downsample")) c.temperal_downsample = bool_list(f, "temperal_downsample");
  c.dropout = f.get_or<double>("dropout", c.dropout);
  c.input_channels = f.get_or<int64_t>("input_channels", c.input_channels);
  c.latents_mean = f.get_or<std::vector<double>>("latents_mean", kLatentsMean);
  c.latents_std = f.get_or<std::vector<double>>("latents_std", kLatentsStd);

  using limits::kMaxLayers, limits::kMaxStages, limits::kMaxWidth;
  const std::string& path = f.origin();
  limits::check_config(path,
                       {{"base_dim", c.base_dim, kMaxWidth, 1},
                        {"z_dim", c.z_dim, kMaxWidth, 1},
                        {"the number of dim_mult", static_cast<int64_t>(c.dim_mult.size()), kMaxStages, 1},
                        {"num_res_blocks", c.num_res_blocks, kMaxLayers, 1},
                        {"input_channels", c.input_channels, kMaxWidth, 1}});
  for (int64_t m : c.dim_mult) limits::check_config(path, {{"dim_mult entry", m, kMaxWidth / c.base_dim, 1}});
  KILN_CHECK(c.attn_scales.empty(),
             f.where("attn_scales")
                 << " is " << f.dump("attn_scales")
                 << ": attention blocks inside the encoder's levels are not supported (Qwen-Image's "
                    "VAE has none: attn_scales [])");
  KILN_CHECK(c.temperal_downsample.size() + 1 == c.dim_mult.size(),
             path << ": temperal_downsample has " << c.temperal_downsample.size()
                  << " entries, expected one per "
                  << "resampling level (len(dim_mult) - 1 = " << c.dim_mult.size() - 1 << ")");
  KILN_CHECK(c.dropout >= 0 && c.dropout < 1, f.where("dropout")
                                                  << ": expected a value in [0, 1), got " << c.dropout);
  for (const char* key : {"latents_mean", "latents_std"}) {
    const auto& values = std::string_view(key) == "latents_mean" ? c.latents_mean : c.latents_std;
    KILN_CHECK(static_cast<int64_t>(values.size()) == c.z_dim,
               f.where(key) << " holds " << values.size()
                            << " values, expected one per latent channel (z_dim " << c.z_dim << ")");
  }
  for (double s : c.latents_std)
    KILN_CHECK(s > 0, f.where("latents_std") << ": expected positive values, got " << s);
  return c;
}

}  // namespace

AutoencoderKLQwenImageConfig AutoencoderKLQwenImageConfig::from_file(const std::string& config_json) {
  return from_config(io::JsonConfig::load(config_json));
}

AutoencoderKLQwenImageConfig AutoencoderKLQwenImageConfig::from_json(const std::string& text,
                                                                     const std::string& origin) {
  return from_config(io::JsonConfig::parse(text, origin));
}

}  // namespace kiln::models
