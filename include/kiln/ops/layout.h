// Ops that move data without arithmetic (concatenation, splitting, gathering, upsampling) and rotary position
// embedding, which permutes pairs of elements within each row.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln {

// torch.cat: tensors of equal rank whose sizes agree except along `dim`; dtypes promote like torch.
Tensor concat(const std::vector<Tensor>& tensors, int64_t dim);
// torch.stack: tensors of identical shape joined along a new dimension `dim` (0..rank).
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);
// torch.split with explicit sizes (they must add up to the size of `dim`). Returns views of x.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// torch.chunk: ceil(size / n)-sized views of x (the last may be smaller; fewer than n when size is small).
std::vector<Tensor> chunk(const Tensor& x, int64_t n, int64_t dim);

// torch.nn.functional.embedding: rows of weight [V, D] picked by ids (int32 or int64, any shape);
// output [*ids.shape, D] in weight's dtype. An id outside [0, V) is an error naming the id.
Tensor embedding(const Tensor& weight, const Tensor& ids);

// torch.nn.functional.interpolate(x, scale_factor=scale, mode="nearest") for x [N, C, H, W].
Tensor upsample_nearest2d(const Tensor& x, int64_t scale);
// torch.nn.functional.interpolate(x, size=(out_h, out_w), mode="nearest").
Tensor upsample_nearest2d(const Tensor& x, int64_t out_h, int64_t out_w);

enum class RopeStyle {
  // Pairs (2i, 2i+1) rotate together: diffusers' apply_rotary_emb(use_real=True, use_real_unbind_dim=-1)
  // (FLUX).
  Interleaved,
  // Element i rotates with i + D/2: the Llama/Mistral rotate_half convention.
  RotateHalf,
};

// Rotary position embedding: x [..., S, D] (usually [B, H, S, D]; D even), cos and sin [S, D].
// out = x * cos + rotate(x) * sin computed in float32, returned in x's dtype (as diffusers casts).
Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeStyle style);

}  // namespace kiln
