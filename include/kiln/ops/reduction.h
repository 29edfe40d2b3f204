// Reductions along a list of dimensions, with torch's semantics: negative dims wrap, an empty list reduces
// over every dimension, `keepdim` keeps reduced dimensions as size 1. bfloat16/float16 inputs accumulate in
// float32 and return their own dtype; float32 sums are blocked so that long reductions stay accurate.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln {

// Floating inputs keep their dtype; integer and bool inputs sum to int64 (like torch.sum).
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Floating dtypes only (like torch.mean).
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Maximum values (no indices); keeps the dtype. Reducing an empty extent is an error, as in torch.
Tensor max(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Variance sum((x - mean)^2) / (N - correction); correction 1 is torch.var's default (Bessel's correction).
// Floating dtypes only; N - correction <= 0 gives inf or nan like torch.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1,
           bool keepdim = false);

}  // namespace kiln
