// Matrix products and convolution (CPU: oneDNN). Accumulation is always float32; the output has the
// inputs' dtype. float32 and bfloat16 run natively; float16 is computed in float32 (this CPU has no
// AVX512-FP16, which oneDNN's f16 kernels need) and rounded once to float16 at the end. Operands must share
// a dtype: mixed inputs (bfloat16 x with a float32 weight) throw, as torch does; convert one explicitly.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "kiln/core/tensor.h"

namespace kiln {

// torch.nn.functional.linear: x [..., K] (any layout), weight [N, K] as stored by torch, optional bias [N]
// -> [..., N]. The bias may also be float32 with a bfloat16/float16 x; it is added in float32 before the
// single rounding to the output dtype.
//
// The weight is reordered once into oneDNN's preferred blocked layout (when the execution context's memory
// policy says so: kiln/runtime/memory_policy.h) and the packed copy is cached on the weight's Storage, keyed
// by the view (offset, shape, strides, dtype), so every later call with that weight reuses it and it is freed
// with the weight.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

// torch.matmul: a [..., M, K] @ b [..., K, N] -> [broadcast(...), M, N]. Batch dims broadcast; a 1-D a is
// a row vector and a 1-D b a column vector, with that dim dropped from the result, as in torch.
// Transposed and permuted views (k.transpose(-1, -2), heads split out of [B, S, H, D]) are used in place.
Tensor matmul(const Tensor& a, const Tensor& b);

// torch.nn.functional.conv2d: x [N, C, H, W] (or unbatched [C, H, W]), weight [O, C / groups, kh, kw],
// optional bias [O] -> [N, O, Ho, Wo] with Ho = (H + 2 ph - dh (kh - 1) - 1) / sh + 1 (likewise Wo).
// The weight is reordered once into the primitive's layout and cached on its Storage, as for linear.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
              std::array<int64_t, 2> stride = {1, 1}, std::array<int64_t, 2> padding = {0, 0},
              std::array<int64_t, 2> dilation = {1, 1}, int64_t groups = 1);

}  // namespace kiln
