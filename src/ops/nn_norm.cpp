// Front ends of softmax and the norms: validate, bring x into contiguous rows, convert affine parameters to
// float32 (exact for every float dtype, and what torch does inside its kernels), pick the output dtype.
#include <algorithm>

#include "kiln/ops/nn.h"
#include "runtime/dispatcher.h"

namespace kiln {

namespace {

bool is_kernel_float(DType d) {
  return d == float32 || d == bfloat16 || d == float16;
}

void check_input(const Tensor& x, const char* op) {
  KILN_CHECK(x.defined(), op << ": input is an undefined tensor");
  KILN_CHECK(is_kernel_float(x.dtype()),
             op << ": expected a float32, bfloat16 or float16 input, got " << x.str());
}

// An optional affine parameter as contiguous float32 [n]; undefined stays undefined.
Tensor float_param(const Tensor& p, const Shape& expected, const char* op, const char* name) {
  if (!p.defined()) return p;
  KILN_CHECK(p.shape() == expected, op << ": " << name << " must have shape " << shape_str(expected)
                                       << ", got " << shape_str(p.shape()));
  KILN_CHECK(is_kernel_float(p.dtype()),
             op << ": " << name << " must be float32, bfloat16 or float16, got " << dtype_name(p.dtype()));
  return p.to(float32).contiguous().view({shape_numel(expected)});
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  check_input(x, "softmax");
  const int64_t rank = x.dim();
  const int64_t d = normalize_dim(dim, std::max<int64_t>(rank, 1), "softmax");
  if (rank == 0) return softmax(x.unsqueeze(0), 0).squeeze(0);
  if (d != rank - 1) return softmax(x.transpose(d, rank - 1), -1).transpose(d, rank - 1).contiguous();
  const int64_t n = x.size(rank - 1);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() == 0) return out;
  runtime::dispatch(runtime::OpCall{"softmax", {x.contiguous().view({rows, n})}, {out.view({rows, n})}, {}});
  return out;
}

Tensor layer_norm(const Tensor& x, int64_t normalized_dims, const Tensor& weight, const Tensor& bias,
                  double eps) {
  check_input(x, "layer_norm");
  KILN_CHECK(normalized_dims >= 1 && normalized_dims <= x.dim(),
             "layer_norm: normalized_dims must be in [1, "
                 << x.dim() << "] for input " << shape_str(x.shape()) << ", got " << normalized_dims);
  const Shape trailing(x.shape().end() - normalized_dims, x.shape().end());
  const int64_t n = shape_numel(trailing);
  const Tensor w = float_param(weight, trailing, "layer_norm", "weight");
  const Tensor b = float_param(bias, trailing, "layer_norm", "bias");
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() == 0) return out;
  const int64_t rows = x.numel() / n;
  runtime::dispatch(runtime::OpCall{"layer_norm",
                                    {x.contiguous().view({rows, n}), w, b},
                                    {out.view({rows, n})},
                                    runtime::Attrs().set("eps", eps)});
  return out;
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  check_input(x, "layer_norm");
  const auto k = static_cast<int64_t>(normalized_shape.size());
  KILN_CHECK(k >= 1 && k <= x.dim() && Shape(x.shape().end() - k, x.shape().end()) == normalized_shape,
             "layer_norm: normalized_shape " << shape_str(normalized_shape)
                                             << " must match the trailing dimensions of input "
                                             << shape_str(x.shape()));
  return layer_norm(x, k, weight, bias, eps);
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps, RmsNormStyle style) {
  check_input(x, "rms_norm");
  KILN_CHECK(x.dim() >= 1, "rms_norm: expected at least 1 dimension, got a 0-d tensor");
  const int64_t n = x.size(-1);
  const Tensor w = float_param(weight, {n}, "rms_norm", "weight");
  // The dtype h = x * rsqrt(...) is rounded to before the weight, and the output dtype (see nn.h).
  DType h_dtype = float32, y_dtype = x.dtype();
  if (style == RmsNormStyle::Diffusers) {
    if (weight.defined()) h_dtype = y_dtype = weight.dtype();
  } else if (style == RmsNormStyle::Llama) {
    h_dtype = x.dtype();
    if (weight.defined()) y_dtype = promote_types(x.dtype(), weight.dtype());
  }
  Tensor out = Tensor::empty(x.shape(), y_dtype, x.device());
  if (x.numel() == 0) return out;
  const int64_t rows = x.numel() / n;
  runtime::dispatch(
      runtime::OpCall{"rms_norm",
                      {x.contiguous().view({rows, n}), w},
                      {out.view({rows, n})},
                      runtime::Attrs().set("eps", eps).set("h_dtype", static_cast<int64_t>(h_dtype))});
  return out;
}

Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias, double eps) {
  check_input(x, "group_norm");
  KILN_CHECK(x.dim() >= 2, "group_norm: expected input [N, C, *], got " << shape_str(x.shape()));
  const int64_t batch = x.size(0), channels = x.size(1);
  KILN_CHECK(num_groups > 0 && channels % num_groups == 0,
             "group_norm: " << channels << " channels of input " << shape_str(x.shape())
                            << " are not divisible into num_groups = " << num_groups);
  const Tensor w = float_param(weight, {channels}, "group_norm", "weight");
  const Tensor b = float_param(bias, {channels}, "group_norm", "bias");
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() == 0) return out;
  const int64_t spatial = x.numel() / (batch * channels);
  runtime::dispatch(runtime::OpCall{"group_norm",
                                    {x.contiguous().view({batch, channels, spatial}), w, b},
                                    {out.view({batch, channels, spatial})},
                                    runtime::Attrs().set("groups", num_groups).set("eps", eps)});
  return out;
}

}  // namespace kiln
