// diffusers' AutoencoderKLQwenImage tiling loop (tiled_decode / tiled_encode), shared by decode and encode.
#pragma once

#include <cstdint>
#include <functional>

#include "kiln/core/tensor.h"

namespace kiln::models::qwen_image_vae {

// One axis pair of a tiling, in the input's units (tile, stride) and the output's (blend, keep, out).
struct TileGrid {
  int64_t tile_h, tile_w;      // input tile size
  int64_t stride_h, stride_w;  // input tile starts
  int64_t blend_h, blend_w;    // output rows / columns a tile fades in over from its upper / left neighbour
  int64_t keep_h, keep_w;      // output rows / columns each tile contributes
  int64_t out_h, out_w;        // the stitched result, cropped
};

// `run` maps each input tile x[:, :, i : i + tile_h, j : j + tile_w] (i, j every stride) to a fresh output
// tile; each is blended in place with the (already blended) tile above and then the one to its left, as
// diffusers' blend_v / blend_h do, cropped to keep_h x keep_w, and the rows stitched and cropped to out_h x
// out_w. Two rows of output tiles are alive at a time.
Tensor run_tiled(const Tensor& x, const TileGrid& grid, const std::function<Tensor(const Tensor&)>& run);

}  // namespace kiln::models::qwen_image_vae
