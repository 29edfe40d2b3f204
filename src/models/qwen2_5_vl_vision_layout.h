// Where each patch of Qwen2.5-VL's vision tower sits: its 2-D rotary position, the window order the blocks
// run in and the attention groups (transformers' get_vision_position_ids, get_vision_window_index and the
// cumulative sequence lengths of its vision attention).
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/models/qwen2_5_vl_vision.h"

namespace kiln::models {

struct VisionLayout {
  // Per patch, in the processor's order: its row and column in its image's patch grid.
  std::vector<int64_t> row, col;
  // The merged patches (groups of spatial_merge_size^2 consecutive patches) in window order: entry i is the
  // merged patch that runs i-th.
  std::vector<int64_t> window_order;
  // Patches per window (empty windows left out) and per image frame, in the order they run.
  std::vector<int64_t> window_lengths, frame_lengths;
};

VisionLayout vision_layout(const std::vector<ImageGrid>& grids, int64_t merge, int64_t window_size,
                           int64_t patch_size);

}  // namespace kiln::models
