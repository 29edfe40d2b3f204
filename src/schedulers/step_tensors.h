// The tensor checks every discrete sampler makes before it steps, and the float32 the steps compute in.
#pragma once

#include "kiln/core/tensor.h"

namespace kiln::schedulers_detail {

// Throws unless `a` and `b` have the same shape and float32, bfloat16 or float16 dtypes; the message names
// the class, the call and both tensors.
void check_same_shape_float(const char* cls, const char* what, const Tensor& a, const char* a_name,
                            const Tensor& b, const char* b_name);

// The samplers compute in float32, as diffusers does for float32 latents (its Euler, Euler ancestral and
// DPM-Solver steps upcast the sample; 16-bit model outputs are upcast here too, one rounding at the end).
inline Tensor as_float32(const Tensor& t) {
  return t.dtype() == float32 ? t : t.to(float32);
}

// DDIM's and PNDM's forward process: sqrt(alpha_prod) * sample + sqrt(1 - alpha_prod) * noise in the sample's
// dtype (alpha_prod is a float32 alphas_cumprod entry).
Tensor add_alpha_noise(const Tensor& sample, const Tensor& noise, float alpha_prod);

}  // namespace kiln::schedulers_detail
