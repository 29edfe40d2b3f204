#include <cmath>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/io/json_config.h"
#include "kiln/models/qwen2_5_vl_vision.h"

namespace kiln::models {

Qwen2_5_VLVisionConfig Qwen2_5_VLVisionConfig::from_file(const std::string& path) {
  const auto file = io::JsonConfig::load(path);
  KILN_CHECK(file.has("vision_config"), file.where("vision_config")
                                            << ": missing (expected a Qwen2_5_VLConfig with a vision tower)");
  const io::JsonConfig c = file.object("vision_config");
  Qwen2_5_VLVisionConfig r;
  r.depth = c.get_or<int64_t>("depth", r.depth);
  r.hidden_size = c.get_or<int64_t>("hidden_size", r.hidden_size);
  r.intermediate_size = c.get_or<int64_t>("intermediate_size", r.intermediate_size);
  r.num_heads = c.get_or<int64_t>("num_heads", r.num_heads);
  // transformers 4 wrote in_chans beside in_channels.
  r.in_channels = c.get_or<int64_t>("in_channels", c.get_or<int64_t>("in_chans", r.in_channels));
  r.out_hidden_size = c.get_or<int64_t>("out_hidden_size", r.out_hidden_size);
  r.patch_size = c.get_or<int64_t>("patch_size", r.patch_size);
  r.temporal_patch_size = c.get_or<int64_t>("temporal_patch_size", r.temporal_patch_size);
  r.spatial_merge_size = c.get_or<int64_t>("spatial_merge_size", r.spatial_merge_size);
  r.window_size = c.get_or<int64_t>("window_size", r.window_size);
  r.fullatt_block_indexes = c.get_or<std::vector<int64_t>>("fullatt_block_indexes", r.fullatt_block_indexes);
  // transformers 5's axial rope_parameters; transformers 4 fixed theta at 10000.
  if (c.has("rope_parameters")) {
    const auto rope = c.object("rope_parameters");
    const std::string type = rope.get_or<std::string>("rope_type", "axial");
    KILN_CHECK(type == "axial", rope.where("rope_type") << ": expected \"axial\", got \"" << type << "\"");
    r.rope_theta = rope.get_or<double>("rope_theta", r.rope_theta);
  }
  const std::string act = c.get_or<std::string>("hidden_act", "silu");
  KILN_CHECK(act == "silu", c.where("hidden_act")
                                << ": expected \"silu\" (SwiGLU MLP), got \"" << act << "\"");
  for (auto [name, v] : {std::pair<const char*, int64_t>{"depth", r.depth},
                         {"hidden_size", r.hidden_size},
                         {"intermediate_size", r.intermediate_size},
                         {"num_heads", r.num_heads},
                         {"in_channels", r.in_channels},
                         {"out_hidden_size", r.out_hidden_size},
                         {"patch_size", r.patch_size},
                         {"temporal_patch_size", r.temporal_patch_size},
                         {"spatial_merge_size", r.spatial_merge_size},
                         {"window_size", r.window_size}}) {
    KILN_CHECK(v > 0, c.where(name) << ": must be positive, got " << v);
  }
  using limits::kMaxLayers, limits::kMaxWidth;
  limits::check_config(path, {{"vision_config.depth", r.depth, kMaxLayers},
                              {"vision_config.hidden_size", r.hidden_size, kMaxWidth},
                              {"vision_config.intermediate_size", r.intermediate_size, kMaxWidth},
                              {"vision_config.num_heads", r.num_heads, kMaxWidth},
                              {"vision_config.in_channels", r.in_channels, 64},
                              {"vision_config.out_hidden_size", r.out_hidden_size, kMaxWidth},
                              {"vision_config.patch_size", r.patch_size, 1024},
                              {"vision_config.temporal_patch_size", r.temporal_patch_size, 64},
                              {"vision_config.spatial_merge_size", r.spatial_merge_size, 64},
                              {"vision_config.window_size", r.window_size, limits::kMaxImageSide}});
  limits::check_config(path, {{"vision_config patch values", r.patch_values(), kMaxWidth},
                              {"vision_config merged width",
                               r.hidden_size * r.spatial_merge_size * r.spatial_merge_size, kMaxWidth}});
  KILN_CHECK(r.hidden_size % r.num_heads == 0 && r.head_dim() % 4 == 0,
             c.where("num_heads") << ": hidden_size " << r.hidden_size << " / num_heads " << r.num_heads
                                  << " must be a whole head size divisible by 4 (2-D rotary embedding)");
  KILN_CHECK(r.window_size >= r.patch_size * r.spatial_merge_size,
             c.where("window_size") << ": " << r.window_size << " is smaller than one merged patch ("
                                    << r.patch_size * r.spatial_merge_size << " pixels)");
  for (int64_t i : r.fullatt_block_indexes) {
    KILN_CHECK(i >= 0 && i < r.depth, c.where("fullatt_block_indexes")
                                          << ": block " << i << " outside 0.." << r.depth - 1);
  }
  KILN_CHECK(std::isfinite(r.rope_theta) && r.rope_theta > 0,
             c.where("rope_parameters") << ": expected a positive rope_theta, got " << r.rope_theta);
  return r;
}

}  // namespace kiln::models
