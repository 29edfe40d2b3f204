// UNet2DConditionConfig: config.json read as diffusers' UNet2DConditionModel.__init__ reads it, for the
// blocks and embeddings Kiln runs; every argument that would build something else is refused by name.
#include <algorithm>
#include <array>
#include <string_view>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/families/stable_diffusion/unet_2d_condition.h"
#include "kiln/io/component_config.h"

namespace kiln::models {

namespace {

constexpr std::array<std::string_view, 22> kRunKeys = {"sample_size",
                                                       "in_channels",
                                                       "out_channels",
                                                       "flip_sin_to_cos",
                                                       "freq_shift",
                                                       "down_block_types",
                                                       "mid_block_type",
                                                       "up_block_types",
                                                       "block_out_channels",
                                                       "layers_per_block",
                                                       "downsample_padding",
                                                       "mid_block_scale_factor",
                                                       "norm_num_groups",
                                                       "norm_eps",
                                                       "cross_attention_dim",
                                                       "transformer_layers_per_block",
                                                       "attention_head_dim",
                                                       "num_attention_heads",
                                                       "use_linear_projection",
                                                       "upcast_attention",
                                                       "addition_embed_type",
                                                       "addition_time_embed_dim"};

// Arguments that only matter for training or for variants whose default Kiln runs: accepted at that default
// (the JSON text it is written as, null for None), refused otherwise.
struct DefaultOnly {
  std::string_view key;
  std::vector<std::string_view> accepted;
  std::string_view what;  // what a non-default value builds
};

const std::vector<DefaultOnly>& default_only() {
  static const std::vector<DefaultOnly> keys = {
      {"center_input_sample", {"false"}, "2 * sample - 1 at the input"},
      {"only_cross_attention", {"false"}, "cross-attention in place of self-attention"},
      {"dual_cross_attention", {"false"}, "dual cross-attention"},
      {"class_embed_type", {"null"}, "class embeddings (an upscaler or variation UNet)"},
      {"num_class_embeds", {"null"}, "class embeddings"},
      {"encoder_hid_dim", {"null"}, "an encoder_hid_proj (Kandinsky, IP-Adapter UNets)"},
      {"encoder_hid_dim_type", {"null"}, "an encoder_hid_proj"},
      {"resnet_time_scale_shift", {"\"default\""}, "scale-shift time conditioning"},
      {"resnet_skip_time_act", {"false"}, "ResNet blocks without the time SiLU"},
      {"resnet_out_scale_factor", {"1", "1.0"}, "scaled ResNet outputs"},
      {"time_embedding_type", {"\"positional\""}, "Fourier time embeddings"},
      {"time_embedding_dim", {"null"}, "a time embedding of another width"},
      {"time_embedding_act_fn", {"null"}, "an activation after the time embedding"},
      {"timestep_post_act", {"null"}, "an activation inside the time embedding"},
      {"time_cond_proj_dim", {"null"}, "a guidance embedding (an LCM-distilled UNet)"},
      {"conv_in_kernel", {"3"}, "another conv_in kernel"},
      {"conv_out_kernel", {"3"}, "another conv_out kernel"},
      {"attention_type", {"\"default\""}, "gated attention (GLIGEN)"},
      {"class_embeddings_concat", {"false"}, "concatenated class embeddings"},
      {"mid_block_only_cross_attention", {"null", "false"}, "a cross-attention-only middle block"},
      {"cross_attention_norm", {"null"}, "a norm before cross-attention"},
      {"act_fn", {"\"silu\""}, "another activation"},
      {"reverse_transformer_layers_per_block", {"null"}, "up blocks with their own transformer depths"},
      {"projection_class_embeddings_input_dim", {}, ""},  // read below, with addition_embed_type
      {"addition_embed_type_num_heads", {}, ""},          // only used by addition_embed_type "text"
      {"dropout", {}, ""},                                // training only
  };
  return keys;
}

// A value diffusers takes as an int (the same for every down block) or a list of one per down block.
std::vector<int64_t> per_block(const io::JsonConfig& f, const std::string& key, size_t blocks,
                               std::vector<int64_t> fallback) {
  if (f.type_of(key) == "number") return std::vector<int64_t>(blocks, f.get<int64_t>(key));
  const std::vector<int64_t> values = f.get_or<std::vector<int64_t>>(key, std::move(fallback));
  KILN_CHECK(values.size() == blocks, f.where(key)
                                          << " holds " << values.size() << " values, expected one per "
                                          << "down block (" << blocks << ") or a single integer");
  return values;
}

}  // namespace

UNet2DConditionConfig UNet2DConditionConfig::from_config(const io::JsonConfig& f) {
  for (const std::string& key : f.keys()) {
    if (key == "_class_name") {
      KILN_CHECK(f.type_of(key) == "string" && f.get<std::string>(key) == "UNet2DConditionModel",
                 f.where(key) << " is " << f.dump(key)
                              << ", expected \"UNet2DConditionModel\" (not a Stable Diffusion UNet config)");
      continue;
    }
    if (key.rfind('_', 0) == 0) continue;  // provenance only
    if (std::find(kRunKeys.begin(), kRunKeys.end(), key) != kRunKeys.end()) continue;
    const auto& others = default_only();
    const auto known =
        std::find_if(others.begin(), others.end(), [&](const DefaultOnly& d) { return d.key == key; });
    KILN_CHECK(
        known != others.end(),
        f.where(key) << " is not a UNet2DConditionModel argument Kiln knows (a UNet of another kind?)");
    if (known->accepted.empty()) continue;
    const std::string value = f.dump(key);
    KILN_CHECK(std::find(known->accepted.begin(), known->accepted.end(), value) != known->accepted.end(),
               f.where(key) << " is " << value << ": " << known->what
                            << ", which Kiln's UNet2DConditionModel does not run (expected "
                            << known->accepted[0] << ")");
  }
  UNet2DConditionConfig c;
  c.sample_size = f.type_of("sample_size") == "number" ? f.get<int64_t>("sample_size") : c.sample_size;
  c.in_channels = f.get_or<int64_t>("in_channels", c.in_channels);
  c.out_channels = f.get_or<int64_t>("out_channels", c.out_channels);
  c.flip_sin_to_cos = f.get_or<bool>("flip_sin_to_cos", c.flip_sin_to_cos);
  c.freq_shift = f.get_or<int64_t>("freq_shift", c.freq_shift);
  c.down_block_types = f.get_or<std::vector<std::string>>("down_block_types", c.down_block_types);
  c.mid_block_type = f.get_or<std::string>("mid_block_type", c.mid_block_type);
  c.up_block_types = f.get_or<std::vector<std::string>>("up_block_types", c.up_block_types);
  c.block_out_channels = f.get_or<std::vector<int64_t>>("block_out_channels", c.block_out_channels);
  const size_t blocks = c.down_block_types.size();
  c.layers_per_block = per_block(f, "layers_per_block", blocks, std::vector<int64_t>(blocks, 2));
  c.downsample_padding = f.get_or<int64_t>("downsample_padding", c.downsample_padding);
  c.mid_block_scale_factor = f.get_or<double>("mid_block_scale_factor", c.mid_block_scale_factor);
  c.norm_num_groups = f.get_or<int64_t>("norm_num_groups", c.norm_num_groups);
  c.norm_eps = f.get_or<double>("norm_eps", c.norm_eps);
  KILN_CHECK(f.type_of("cross_attention_dim") != "array",
             f.where("cross_attention_dim")
                 << " is a list: per-block cross-attention widths are not supported");
  c.cross_attention_dim = f.get_or<int64_t>("cross_attention_dim", c.cross_attention_dim);
  c.transformer_layers_per_block =
      per_block(f, "transformer_layers_per_block", blocks, std::vector<int64_t>(blocks, 1));
  // diffusers' legacy naming: attention_head_dim holds the number of heads when num_attention_heads is unset.
  const std::string heads_key = f.has("num_attention_heads") ? "num_attention_heads" : "attention_head_dim";
  c.num_attention_heads = per_block(f, heads_key, blocks, std::vector<int64_t>(blocks, 8));
  c.use_linear_projection = f.get_or<bool>("use_linear_projection", c.use_linear_projection);
  c.upcast_attention = f.get_or<bool>("upcast_attention", c.upcast_attention);
  c.addition_embed_type = f.get_or<std::string>("addition_embed_type", "");
  c.addition_time_embed_dim = f.get_or<int64_t>("addition_time_embed_dim", 0);
  c.projection_class_embeddings_input_dim = f.get_or<int64_t>("projection_class_embeddings_input_dim", 0);
  c.validate(f.origin());
  return c;
}

UNet2DConditionConfig UNet2DConditionConfig::from_json(const std::string& text, const std::string& source) {
  return from_config(io::JsonConfig::parse(text, source));
}

UNet2DConditionConfig UNet2DConditionConfig::from_file(const std::string& path) {
  return from_config(io::JsonConfig::load(io::config_file_in(path, "config.json")));
}

void UNet2DConditionConfig::validate(const std::string& source) const {
  const size_t blocks = down_block_types.size();
  KILN_CHECK(
      blocks >= 1 && blocks <= 8 && up_block_types.size() == blocks && block_out_channels.size() == blocks,
      source << ": down_block_types, up_block_types and block_out_channels must have the same length (1 to "
                "8), got "
             << blocks << ", " << up_block_types.size() << " and " << block_out_channels.size());
  limits::check_config(source, {{"in_channels", in_channels, limits::kMaxWidth},
                                {"out_channels", out_channels, limits::kMaxWidth},
                                {"cross_attention_dim", cross_attention_dim, limits::kMaxWidth},
                                {"norm_num_groups", norm_num_groups, limits::kMaxWidth}});
  for (size_t i = 0; i < blocks; ++i) {
    const std::string& down = down_block_types[i];
    const std::string& up = up_block_types[i];
    KILN_CHECK(down == "CrossAttnDownBlock2D" || down == "DownBlock2D",
               source << ": down_block_types[" << i << "] is \"" << down
                      << "\"; Kiln runs CrossAttnDownBlock2D and DownBlock2D");
    KILN_CHECK(up == "CrossAttnUpBlock2D" || up == "UpBlock2D",
               source << ": up_block_types[" << i << "] is \"" << up
                      << "\"; Kiln runs CrossAttnUpBlock2D and UpBlock2D");
    const int64_t channels = block_out_channels[i];
    KILN_CHECK(channels > 0 && channels <= limits::kMaxWidth && channels % norm_num_groups == 0,
               source << ": block_out_channels[" << i << "] (" << channels
                      << ") must be a positive multiple of norm_num_groups (" << norm_num_groups << ")");
    KILN_CHECK(layers_per_block[i] >= 1 && layers_per_block[i] <= limits::kMaxLayers &&
                   transformer_layers_per_block[i] >= 1 &&
                   transformer_layers_per_block[i] <= limits::kMaxLayers,
               source << ": layers_per_block and transformer_layers_per_block must be at least 1 (block " << i
                      << ")");
    KILN_CHECK(num_attention_heads[i] >= 1 && channels % num_attention_heads[i] == 0,
               source << ": block " << i << " has " << channels << " channels, not divisible into "
                      << num_attention_heads[i] << " attention heads");
  }
  KILN_CHECK(mid_block_type == "UNetMidBlock2DCrossAttn",
             source << ": mid_block_type is \"" << mid_block_type << "\"; Kiln runs UNetMidBlock2DCrossAttn");
  KILN_CHECK(norm_eps > 0, source << ": norm_eps must be positive, got " << norm_eps);
  KILN_CHECK(downsample_padding == 1,
             source << ": downsample_padding is " << downsample_padding
                    << "; Kiln runs the stride-2 convolution padded by 1 (every SD config)");
  KILN_CHECK(freq_shift == 0 || freq_shift == 1, source << ": freq_shift must be 0 or 1, got " << freq_shift);
  if (!addition_embed_type.empty()) {
    KILN_CHECK(addition_embed_type == "text_time", source << ": addition_embed_type is \""
                                                          << addition_embed_type
                                                          << "\"; Kiln runs SDXL's \"text_time\" (or none)");
    KILN_CHECK(
        addition_time_embed_dim > 0 && addition_time_embed_dim % 2 == 0 &&
            projection_class_embeddings_input_dim > 6 * addition_time_embed_dim &&
            projection_class_embeddings_input_dim <= limits::kMaxWidth,
        source << ": addition_embed_type \"text_time\" needs an even addition_time_embed_dim and a "
                  "projection_class_embeddings_input_dim above 6 times it (the pooled text width plus six "
                  "time ids), got "
               << addition_time_embed_dim << " and " << projection_class_embeddings_input_dim);
  }
  KILN_CHECK(block_out_channels.front() % 2 == 0,
             source << ": block_out_channels[0] must be even (the timestep sinusoid's width)");
}

}  // namespace kiln::models
