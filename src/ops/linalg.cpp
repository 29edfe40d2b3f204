// Front ends of linear, matmul and conv2d: argument checks, output shapes, and the layout normalisation
// that lets the kernels hand every view straight to oneDNN's fast (brgemm) kernels.
#include "kiln/ops/linalg.h"

#include <string>

#include "kiln/runtime/memory_policy.h"
#include "runtime/dispatcher.h"

namespace kiln {

namespace {

void check_floating(const char* op, const char* name, const Tensor& t) {
  KILN_CHECK(t.dtype() == float32 || t.dtype() == bfloat16 || t.dtype() == float16,
             op << ": " << name << " must be float32, bfloat16 or float16, got " << dtype_name(t.dtype())
                << " " << shape_str(t.shape()));
}

void check_same_dtype(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b) {
  KILN_CHECK(a.dtype() == b.dtype(), op << ": " << name_a << " " << shape_str(a.shape()) << " is "
                                        << dtype_name(a.dtype()) << " but " << name_b << " "
                                        << shape_str(b.shape()) << " is " << dtype_name(b.dtype())
                                        << "; convert one of them with .to(dtype) first");
}

// True when the last two dims form a row-major or column-major matrix (unit stride along one of them).
// oneDNN's brgemm kernels take such operands with any leading dimension and any batch strides.
bool is_matrix_layout(const Tensor& t) {
  const int64_t r = t.dim();
  const int64_t rows = t.size(r - 2), cols = t.size(r - 1);
  const int64_t rs = t.stride(r - 2), cs = t.stride(r - 1);
  const bool row_major = (cols == 1 || cs == 1) && (rows == 1 || rs >= cols);
  const bool col_major = (rows == 1 || rs == 1) && (cols == 1 || cs >= rows);
  return row_major || col_major;
}

Tensor as_matrix_operand(const Tensor& t) {
  return is_matrix_layout(t) ? t : t.contiguous();
}

// Bias for the kernels: contiguous, and in the output dtype or float32.
Tensor check_bias(const char* op, const Tensor& bias, int64_t n, const Tensor& x) {
  if (!bias.defined()) return bias;
  KILN_CHECK(bias.dim() == 1 && bias.size(0) == n,
             op << ": expected bias [" << n << "], got " << shape_str(bias.shape()));
  KILN_CHECK(bias.dtype() == x.dtype() || bias.dtype() == float32,
             op << ": bias is " << dtype_name(bias.dtype()) << " but x is " << dtype_name(x.dtype())
                << "; expected the same dtype or float32");
  return bias.contiguous();
}

// Output filled with the bias (or zeros): the value of a product over an empty K.
Tensor bias_or_zeros(const Shape& shape, DType dtype, const Tensor& bias, Device device) {
  Tensor out = Tensor::zeros(shape, dtype, device);
  if (bias.defined()) {
    Shape bshape(shape.size(), 1);
    bshape[1 < shape.size() ? 1 : 0] = bias.size(0);
    out.copy_(bias.view(bshape).expand(shape));
  }
  return out;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  KILN_CHECK(x.defined() && weight.defined(), "linear: x and weight must be defined");
  KILN_CHECK(weight.dim() == 2,
             "linear: expected weight [out_features, in_features], got " << shape_str(weight.shape()));
  KILN_CHECK(x.dim() >= 1, "linear: expected x [..., in_features], got a 0-d tensor");
  check_floating("linear", "x", x);
  check_floating("linear", "weight", weight);
  check_same_dtype("linear", "x", x, "weight", weight);
  const int64_t n = weight.size(0), k = weight.size(1);
  KILN_CHECK(x.size(-1) == k, "linear: x " << shape_str(x.shape()) << " has " << x.size(-1)
                                           << " features but weight " << shape_str(weight.shape())
                                           << " expects " << k);
  const Tensor b = check_bias("linear", bias, n, x);

  Shape out_shape = x.shape();
  out_shape.back() = n;
  int64_t m = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) m *= x.size(d);
  if (m == 0 || n == 0) return Tensor::empty(out_shape, x.dtype(), x.device());
  if (k == 0) {
    Tensor out = bias_or_zeros({m, n}, x.dtype(), b, x.device());
    return out.view(out_shape);
  }

  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  std::vector<Tensor> inputs{as_matrix_operand(x.reshape({m, k})), as_matrix_operand(weight)};
  if (b.defined()) inputs.push_back(b);
  runtime::dispatch(runtime::OpCall{"linear",
                                    std::move(inputs),
                                    {out.view({m, n})},
                                    runtime::Attrs().set("prepack", weight_is_prepacked(weight.dtype()))});
  return out;
}

namespace {

// A view of `t` with `shape`/`strides` over the same storage.
Tensor restride(const Tensor& t, Shape shape, Strides strides) {
  return Tensor(t.storage(), std::move(shape), std::move(strides), t.offset(), t.dtype());
}

// Brings `t` ([batch..., r, c]) to `rank` dims by leading size-1 dims, and turns broadcast (stride-0) batch
// dims back into size-1 dims: oneDNN broadcasts size-1 batch dims itself but falls back to its reference
// kernel for stride-0 ones.
Tensor matmul_operand(const Tensor& t, size_t rank) {
  Shape shape(rank - t.shape().size(), 1);
  Strides strides(rank - t.shape().size(), 0);
  shape.insert(shape.end(), t.shape().begin(), t.shape().end());
  strides.insert(strides.end(), t.strides().begin(), t.strides().end());
  for (size_t d = 0; d + 2 < rank; ++d)
    if (strides[d] == 0) shape[d] = 1;
  return restride(t, shape, strides);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.defined() && b.defined(), "matmul: both operands must be defined");
  KILN_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: expected operands with at least 1 dim, got "
                                               << shape_str(a.shape()) << " and " << shape_str(b.shape()));
  check_floating("matmul", "a", a);
  check_floating("matmul", "b", b);
  check_same_dtype("matmul", "a", a, "b", b);
  const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  const int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
  KILN_CHECK(b2.size(-2) == k, "matmul: a " << shape_str(a.shape()) << " and b " << shape_str(b.shape())
                                            << " cannot be multiplied: a has " << k << " columns, b has "
                                            << b2.size(-2) << " rows");
  const Shape a_batch(a2.shape().begin(), a2.shape().end() - 2);
  const Shape b_batch(b2.shape().begin(), b2.shape().end() - 2);
  const Shape batch = broadcast_shapes(a_batch, b_batch, "matmul");

  Shape full_shape = batch;
  full_shape.push_back(m);
  full_shape.push_back(n);
  Shape result_shape = batch;
  if (a.dim() > 1) result_shape.push_back(m);
  if (b.dim() > 1) result_shape.push_back(n);

  int64_t batch_count = 1;
  for (int64_t s : batch) batch_count *= s;
  if (batch_count == 0 || m == 0 || n == 0) return Tensor::empty(result_shape, a.dtype(), a.device());
  if (k == 0) return Tensor::zeros(result_shape, a.dtype(), a.device());

  const size_t rank = full_shape.size();
  Tensor ao = matmul_operand(a2, rank);
  Tensor bo = matmul_operand(b2, rank);
  // A batch dim broadcast in both operands (both expanded views): materialise it in a, since oneDNN needs
  // one operand to carry the output's batch size.
  for (size_t d = 0; d + 2 < rank; ++d) {
    if (batch[d] > 1 && ao.size(d) == 1 && bo.size(d) == 1) {
      Shape s = ao.shape();
      s[d] = batch[d];
      ao = ao.expand(s).contiguous();
    }
  }
  Tensor out = Tensor::empty(full_shape, a.dtype(), a.device());
  runtime::dispatch(runtime::OpCall{"matmul", {as_matrix_operand(ao), as_matrix_operand(bo)}, {out}, {}});
  return out.view(result_shape);
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, std::array<int64_t, 2> stride,
              std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  KILN_CHECK(x.defined() && weight.defined(), "conv2d: x and weight must be defined");
  KILN_CHECK(x.dim() == 4 || x.dim() == 3,
             "conv2d: expected x [N, C, H, W] or [C, H, W], got " << shape_str(x.shape()));
  if (x.dim() == 3) {
    return conv2d(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0);
  }
  KILN_CHECK(weight.dim() == 4, "conv2d: expected weight [out_channels, in_channels / groups, kh, kw], got "
                                    << shape_str(weight.shape()));
  check_floating("conv2d", "x", x);
  check_floating("conv2d", "weight", weight);
  check_same_dtype("conv2d", "x", x, "weight", weight);
  KILN_CHECK(groups >= 1, "conv2d: expected groups >= 1, got " << groups);
  for (int i = 0; i < 2; ++i) {
    KILN_CHECK(stride[i] >= 1 && padding[i] >= 0 && dilation[i] >= 1,
               "conv2d: expected stride >= 1, padding >= 0 and dilation >= 1, got stride {"
                   << stride[0] << ", " << stride[1] << "}, padding {" << padding[0] << ", " << padding[1]
                   << "}, dilation {" << dilation[0] << ", " << dilation[1] << "}");
  }
  const int64_t n = x.size(0), c = x.size(1), o = weight.size(0);
  KILN_CHECK(c % groups == 0 && o % groups == 0 && weight.size(1) * groups == c,
             "conv2d: x " << shape_str(x.shape()) << " has " << c << " channels, weight "
                          << shape_str(weight.shape()) << " with groups=" << groups << " expects "
                          << weight.size(1) * groups << " (and out_channels divisible by groups)");
  const Tensor b = check_bias("conv2d", bias, o, x);
  Shape out_shape{n, o, 0, 0};
  for (int i = 0; i < 2; ++i) {
    const int64_t extent = dilation[i] * (weight.size(2 + i) - 1) + 1;
    const int64_t padded = x.size(2 + i) + 2 * padding[i];
    KILN_CHECK(padded >= extent, "conv2d: kernel "
                                     << shape_str(weight.shape()) << " with dilation {" << dilation[0] << ", "
                                     << dilation[1] << "} is larger than the padded input "
                                     << shape_str(x.shape()) << " (padding {" << padding[0] << ", "
                                     << padding[1] << "})");
    out_shape[2 + i] = (padded - extent) / stride[i] + 1;
  }
  if (n == 0 || o == 0) return Tensor::empty(out_shape, x.dtype(), x.device());
  if (c == 0) return bias_or_zeros(out_shape, x.dtype(), b, x.device());

  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  std::vector<Tensor> inputs{x, weight};
  if (b.defined()) inputs.push_back(b);
  runtime::dispatch(runtime::OpCall{"conv2d",
                                    std::move(inputs),
                                    {out},
                                    runtime::Attrs()
                                        .set("stride", std::vector<int64_t>{stride[0], stride[1]})
                                        .set("padding", std::vector<int64_t>{padding[0], padding[1]})
                                        .set("dilation", std::vector<int64_t>{dilation[0], dilation[1]})
                                        .set("groups", groups)});
  return out;
}

}  // namespace kiln
