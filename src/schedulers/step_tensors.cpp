#include "schedulers/step_tensors.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/ops/elementwise.h"

namespace kiln::schedulers_detail {

namespace {

bool is_supported_float(DType d) {
  return d == float32 || d == bfloat16 || d == float16;
}

}  // namespace

void check_same_shape_float(const char* cls, const char* what, const Tensor& a, const char* a_name,
                            const Tensor& b, const char* b_name) {
  KILN_CHECK(a.shape() == b.shape(), cls << "::" << what << ": " << a_name << " " << shape_str(a.shape())
                                         << " and " << b_name << " " << shape_str(b.shape())
                                         << " must have the same shape");
  KILN_CHECK(is_supported_float(a.dtype()) && is_supported_float(b.dtype()),
             cls << "::" << what << ": expected float32, bfloat16 or float16 tensors, got " << a_name << " "
                 << dtype_name(a.dtype()) << " and " << b_name << " " << dtype_name(b.dtype()));
}

Tensor add_alpha_noise(const Tensor& sample, const Tensor& noise, float alpha_prod) {
  return add(mul(sample, static_cast<double>(std::sqrt(alpha_prod))),
             mul(noise.to(sample.dtype()), static_cast<double>(std::sqrt(1.0f - alpha_prod))));
}

}  // namespace kiln::schedulers_detail
