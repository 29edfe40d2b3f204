#include "families/stable_diffusion/unet_activations.h"

#include <algorithm>

#include "kiln/pipelines/activation_estimate.h"

namespace kiln {

int64_t unet_activation_bytes(const models::UNet2DConditionConfig& c, int64_t batch, int64_t h, int64_t w,
                              DType dtype) {
  const auto element = static_cast<int64_t>(dtype_size(dtype));
  int64_t skips = batch * c.block_out_channels.front() * h * w * element;  // conv_in's output
  int64_t level_peak = 0;
  for (size_t i = 0; i < c.block_out_channels.size(); ++i) {
    const int64_t channels = c.block_out_channels[i];
    const int64_t map = batch * channels * h * w * element;
    skips += map * (c.layers_per_block[i] + (i + 1 < c.block_out_channels.size() ? 1 : 0));
    // A ResNet block on the up path reads the concatenation (twice the width) and keeps a few maps alive.
    int64_t peak = 6 * map;
    if (c.down_block_types[i] == "CrossAttnDownBlock2D")
      peak = std::max(peak, block_stack_activation_bytes({.batch = batch,
                                                          .tokens = h * w,
                                                          .width = channels,
                                                          .mlp_width = 8 * channels,
                                                          .heads = c.num_attention_heads[i]},
                                                         dtype));
    level_peak = std::max(level_peak, peak);
    h = (h + 1) / 2;
    w = (w + 1) / 2;
  }
  return skips + level_peak;
}

}  // namespace kiln
