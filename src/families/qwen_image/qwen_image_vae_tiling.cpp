#include "families/qwen_image/qwen_image_vae_tiling.h"

#include <algorithm>
#include <vector>

#include "kiln/ops.h"

namespace kiln::models::qwen_image_vae {

namespace {

// blend_v (dim 2) / blend_h (dim 3): b's first `extent` lines fade in from a's last ones, in place. The
// weights are Python floats (double), each product rounded to the tensor's dtype as torch does.
void blend(const Tensor& a, Tensor& b, int64_t dim, int64_t extent) {
  extent = std::min({a.size(dim), b.size(dim), extent});
  for (int64_t y = 0; y < extent; ++y) {
    const double w = static_cast<double>(y) / static_cast<double>(extent);
    Tensor line = b.narrow(dim, y, 1);
    line.copy_(add(mul(a.narrow(dim, a.size(dim) - extent + y, 1), 1.0 - w), mul(line, w)));
  }
}

}  // namespace

Tensor run_tiled(const Tensor& x, const TileGrid& g, const std::function<Tensor(const Tensor&)>& run) {
  const int64_t H = x.size(2), W = x.size(3);
  std::vector<Tensor> above, rows;
  for (int64_t i = 0; i < H; i += g.stride_h) {
    std::vector<Tensor> row;
    for (int64_t j = 0; j < W; j += g.stride_w)
      row.push_back(run(x.narrow(2, i, std::min(g.tile_h, H - i)).narrow(3, j, std::min(g.tile_w, W - j))));
    std::vector<Tensor> crops;
    for (size_t j = 0; j < row.size(); ++j) {
      Tensor& tile = row[j];
      if (!above.empty()) blend(above[j], tile, 2, g.blend_h);
      if (j > 0) blend(row[j - 1], tile, 3, g.blend_w);
      crops.push_back(
          tile.narrow(2, 0, std::min(g.keep_h, tile.size(2))).narrow(3, 0, std::min(g.keep_w, tile.size(3))));
    }
    rows.push_back(concat(crops, 3));
    above = std::move(row);
  }
  const Tensor whole = concat(rows, 2);
  return whole.narrow(2, 0, std::min(g.out_h, whole.size(2)))
      .narrow(3, 0, std::min(g.out_w, whole.size(3)))
      .contiguous();
}

}  // namespace kiln::models::qwen_image_vae
