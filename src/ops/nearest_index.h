// upsample_nearest2d's source index, the op's definition shared by every backend (the CPU kernel and the
// StableHLO lowering): torch's nearest_idx (aten/src/ATen/native/UpSample.h), including its float rounding.
#pragma once

#include <cmath>
#include <cstdint>

namespace kiln::ops {

// The input element that output element `dst` copies, along a dim of `in` inputs resampled to `out`;
// `scale` > 0 is an integer scale factor given by the caller (torch's scale_factor), else in/out is used.
inline int64_t nearest_source(int64_t dst, int64_t in, int64_t out, int64_t scale) {
  if (out == in) return dst;
  if (out == 2 * in) return dst >> 1;
  const float ratio = scale > 0 ? static_cast<float>(1.0 / static_cast<double>(scale))
                                : static_cast<float>(in) / static_cast<float>(out);
  const auto idx = static_cast<int64_t>(std::floor(static_cast<float>(dst) * ratio));
  return idx < in - 1 ? idx : in - 1;
}

}  // namespace kiln::ops
