// Neural-network building blocks that normalise along dimensions: softmax and the norms used by the DiT,
// text-encoder and VAE models. Statistics are computed in float32 for every input dtype; outputs follow the
// dtype rules of the PyTorch module each op mirrors (documented per op).
#pragma once

#include <cstdint>

#include "kiln/core/tensor.h"

namespace kiln {

// torch.softmax(x, dim): floating x, output in x's dtype (float32 math).
Tensor softmax(const Tensor& x, int64_t dim);

// torch.nn.functional.layer_norm over the trailing `normalized_dims` dimensions. `weight` and `bias` may be
// undefined (elementwise_affine=False, as FLUX's norms use); when given they have the normalised shape and
// any floating dtype. Output in x's dtype.
Tensor layer_norm(const Tensor& x, int64_t normalized_dims, const Tensor& weight, const Tensor& bias,
                  double eps = 1e-5);
// The same with the normalised shape spelled out, as torch takes it; it must equal x's trailing dimensions.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps = 1e-5);

// How rms_norm rounds before applying the weight (the models differ, and bf16 results differ with them).
enum class RmsNormStyle {
  // diffusers' RMSNorm, and transformers' T5LayerNorm (identical when a weight is given):
  // h = x * rsqrt(mean(x^2) + eps) in float32; with a weight, h is rounded to the weight's dtype when that is
  // bf16/f16 and the output is h * weight in the weight's dtype (float32 for a float32 weight, whatever x
  // is);
  // without a weight the output is h in x's dtype.
  Diffusers,
  // transformers' Llama/Mistral RMSNorm: h is rounded to x's dtype first, then multiplied by the weight; the
  // output dtype is the promotion of x's and the weight's dtypes.
  Llama,
  // torch.nn.RMSNorm (F.rms_norm): h and h * weight in float32, rounded once to x's dtype, the output dtype.
  Torch,
};

// RMS norm over the last dimension. `weight` ([D]) may be undefined.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps,
                RmsNormStyle style = RmsNormStyle::Diffusers);

// torch.nn.functional.group_norm: x [N, C, *], C divisible by num_groups; weight and bias [C] or undefined.
// Output in x's dtype.
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps = 1e-5);

}  // namespace kiln
