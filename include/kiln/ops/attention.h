// Scaled dot-product attention, as torch.nn.functional.scaled_dot_product_attention:
//   out = softmax(q @ k^T * scale + bias, masked causally when asked) @ v
// computed tile by tile with an online softmax, so the [Sq, Skv] score matrix never exists in memory.
#pragma once

#include <optional>

#include "kiln/core/tensor.h"

namespace kiln {

struct AttentionOptions {
  // Multiplies q @ k^T before the bias is added; 1/sqrt(D) when unset (T5 passes 1.0).
  std::optional<double> scale;
  // Query i attends to keys j <= i only (torch's top-left alignment, also when Sq != Skv), as CLIP uses.
  bool is_causal = false;
  // Optional additive bias broadcastable to [B, H, Sq, Skv] (T5's position bias, padding masks with -inf),
  // float32, bfloat16 or float16 whatever q's dtype, added in float32. A bool mask is also accepted, with
  // torch's meaning: true = the key takes part, false = it is masked out.
  Tensor bias;
};

// q [B, H, Sq, D], k [B, H, Skv, D], v [B, H, Skv, Dv], one dtype: float32, bfloat16 or float16
// -> [B, H, Sq, Dv] in q's dtype.
// Any strides are accepted (a head-split view of a [B, S, H, D] projection is read in place). Like torch,
// the output copies q's layout: when q is such a [B, S, H, D]-ordered view, the output is a transposed view
// of a [B, Sq, H, Dv] buffer, so merging the heads back afterwards costs no copy.
// Math: float32 inputs use float32 throughout; bfloat16 inputs take bfloat16 products with float32
// accumulation and a float32 softmax whose probabilities are rounded to bfloat16 before they multiply v
// (as torch does); float16 inputs are computed in float32. Rows whose keys are all masked give zeros, and
// Skv = 0 gives zeros, as in torch.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});

}  // namespace kiln
