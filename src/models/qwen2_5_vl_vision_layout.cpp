#include "qwen2_5_vl_vision_layout.h"

#include <algorithm>

namespace kiln::models {

VisionLayout vision_layout(const std::vector<ImageGrid>& grids, int64_t merge, int64_t window_size,
                           int64_t patch_size) {
  VisionLayout r;
  // A window's side in merged patches.
  const int64_t side = window_size / merge / patch_size;
  int64_t merged_before = 0;
  for (const ImageGrid& g : grids) {
    const int64_t mh = g.h / merge, mw = g.w / merge;
    // Patches come merge x merge block by block (row-major blocks), each block row-major inside.
    for (int64_t t = 0; t < g.t; ++t) {
      for (int64_t bh = 0; bh < mh; ++bh) {
        for (int64_t bw = 0; bw < mw; ++bw) {
          for (int64_t i = 0; i < merge; ++i) {
            for (int64_t j = 0; j < merge; ++j) {
              r.row.push_back(bh * merge + i);
              r.col.push_back(bw * merge + j);
            }
          }
        }
      }
      r.frame_lengths.push_back(g.h * g.w);
    }
    // Windows of side x side merged patches tile each frame from its top-left corner (the last row and column
    // of windows cut short); each window's merged patches in row-major order.
    const int64_t windows_h = mh / side + 1, windows_w = mw / side + 1;
    for (int64_t t = 0; t < g.t; ++t) {
      for (int64_t wy = 0; wy < windows_h; ++wy) {
        for (int64_t wx = 0; wx < windows_w; ++wx) {
          int64_t count = 0;
          for (int64_t y = wy * side; y < std::min((wy + 1) * side, mh); ++y) {
            for (int64_t x = wx * side; x < std::min((wx + 1) * side, mw); ++x) {
              r.window_order.push_back(merged_before + (t * mh + y) * mw + x);
              ++count;
            }
          }
          if (count > 0) r.window_lengths.push_back(count * merge * merge);
        }
      }
    }
    merged_before += g.t * mh * mw;
  }
  return r;
}

}  // namespace kiln::models
