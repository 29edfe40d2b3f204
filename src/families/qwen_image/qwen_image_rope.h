// QwenEmbedRope(theta=10000, axes_dim, scale_rope=True) of diffusers' transformer_qwenimage.py, as the cos
// and sin tables Kiln's interleaved-pair RoPE reads.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/families/qwen_image/qwen_image_transformer.h"

namespace kiln::models {

// The joint sequence's tables, text first: cos and sin [text_length + sum(f * h * w), sum(axes_dims)]
// float32. Image number i (of `shapes`, in order) puts its patch (f, r, c) at the positions (i + f, r - (h -
// h / 2), c - (w - w / 2)) on the three axes: centred, its negative half first. Text token j sits at m + j on
// every axis, m the largest h / 2 and w / 2 of the images. Per axis of width d, angle = position *
// theta^(-2k/d) for k < d / 2, computed in float32 as torch computes rope_params, each cos/sin repeated for
// the pair (2k, 2k + 1) it rotates; the axes follow one another. Positions beyond diffusers' tables (|p| >=
// 4096) are refused by name.
struct QwenRopeTables {
  Tensor cos, sin;
};
QwenRopeTables qwen_image_rope(const std::vector<QwenImageShape>& shapes, int64_t text_length,
                               const std::vector<int64_t>& axes_dims, double theta = 10000.0);

}  // namespace kiln::models
