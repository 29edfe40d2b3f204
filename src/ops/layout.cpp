// Front ends of the layout ops. split/chunk are views; stack is concat of unsqueezed views; the rest
// validate, normalise their operands (dtype, contiguity, rank) and dispatch one kernel.
#include "kiln/ops/layout.h"

#include <algorithm>

#include "runtime/dispatcher.h"

namespace kiln {

Tensor concat(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "concat: expected at least one tensor");
  const Tensor& first = tensors.front();
  KILN_CHECK(first.defined(), "concat: tensor 0 is undefined");
  KILN_CHECK(first.dim() > 0, "concat: zero-dimensional tensor 0 cannot be concatenated");
  const int64_t d = normalize_dim(dim, first.dim(), "concat");
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  DType dtype = first.dtype();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.defined(), "concat: tensor " << i << " is undefined");
    bool ok = t.dim() == first.dim();
    for (int64_t k = 0; ok && k < t.dim(); ++k) ok = k == d || t.size(k) == first.size(k);
    KILN_CHECK(ok, "concat: tensor " << i << " has shape " << shape_str(t.shape()) << ", expected "
                                     << shape_str(first.shape()) << " in every dimension except " << d);
    out_shape[d] += t.size(d);
    dtype = promote_types(dtype, t.dtype());
  }
  Tensor out = Tensor::empty(out_shape, dtype, first.device());
  std::vector<Tensor> inputs;
  for (const Tensor& t : tensors)
    if (t.numel() > 0) inputs.push_back(t.to(dtype).contiguous());
  if (inputs.empty()) return out;
  runtime::dispatch(runtime::OpCall{"concat", std::move(inputs), {out}, runtime::Attrs().set("dim", d)});
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "stack: expected at least one tensor");
  KILN_CHECK(tensors.front().defined(), "stack: tensor 0 is undefined");
  const int64_t d = normalize_dim(dim, tensors.front().dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    KILN_CHECK(
        tensors[i].defined() && tensors[i].shape() == tensors.front().shape(),
        "stack: tensor " << i << " has shape "
                         << (tensors[i].defined() ? shape_str(tensors[i].shape()) : std::string("undefined"))
                         << ", expected " << shape_str(tensors.front().shape()) << " like tensor 0");
    parts.push_back(tensors[i].unsqueeze(d));
  }
  return concat(parts, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  KILN_CHECK(x.defined(), "split: input is an undefined tensor");
  const int64_t d = normalize_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0, "split: sizes must be non-negative, got " << shape_str(sizes));
    total += s;
  }
  KILN_CHECK(total == x.size(d), "split: sizes " << shape_str(sizes) << " add up to " << total
                                                 << ", but dimension " << d << " of " << shape_str(x.shape())
                                                 << " has size " << x.size(d));
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    parts.push_back(x.narrow(d, start, s));
    start += s;
  }
  return parts;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t n, int64_t dim) {
  KILN_CHECK(x.defined(), "chunk: input is an undefined tensor");
  KILN_CHECK(n > 0, "chunk: number of chunks must be positive, got " << n);
  const int64_t d = normalize_dim(dim, x.dim(), "chunk");
  const int64_t size = x.size(d);
  if (size == 0) return {x};
  const int64_t each = (size + n - 1) / n;
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < size; start += each) sizes.push_back(std::min(each, size - start));
  return split(x, sizes, d);
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  KILN_CHECK(weight.defined() && weight.dim() == 2,
             "embedding: expected weight [V, D], got "
                 << (weight.defined() ? shape_str(weight.shape()) : "undefined"));
  KILN_CHECK(
      ids.defined() && (ids.dtype() == int64 || ids.dtype() == int32),
      "embedding: expected int32 or int64 ids, got " << (ids.defined() ? ids.str() : "an undefined tensor"));
  Shape out_shape = ids.shape();
  out_shape.push_back(weight.size(1));
  Tensor out = Tensor::empty(out_shape, weight.dtype(), weight.device());
  if (out.numel() == 0 && ids.numel() == 0) return out;
  runtime::dispatch(runtime::OpCall{"embedding", {weight.contiguous(), ids.contiguous()}, {out}, {}});
  return out;
}

namespace {
Tensor upsample_nearest(const Tensor& x, int64_t out_h, int64_t out_w, int64_t scale) {
  KILN_CHECK(x.defined() && x.dim() == 4,
             "upsample_nearest2d: expected input [N, C, H, W], got "
                 << (x.defined() ? shape_str(x.shape()) : "an undefined tensor"));
  KILN_CHECK(out_h > 0 && out_w > 0,
             "upsample_nearest2d: output size must be positive, got [" << out_h << ", " << out_w << "]");
  Tensor out = Tensor::empty({x.size(0), x.size(1), out_h, out_w}, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  KILN_CHECK(x.size(2) > 0 && x.size(3) > 0,
             "upsample_nearest2d: cannot upsample an empty input " << shape_str(x.shape()));
  runtime::dispatch(
      runtime::OpCall{"upsample_nearest2d", {x.contiguous()}, {out}, runtime::Attrs().set("scale", scale)});
  return out;
}
}  // namespace

Tensor upsample_nearest2d(const Tensor& x, int64_t scale) {
  KILN_CHECK(scale >= 1, "upsample_nearest2d: scale must be >= 1, got " << scale);
  KILN_CHECK(x.defined() && x.dim() == 4,
             "upsample_nearest2d: expected input [N, C, H, W], got "
                 << (x.defined() ? shape_str(x.shape()) : "an undefined tensor"));
  return upsample_nearest(x, x.size(2) * scale, x.size(3) * scale, scale);
}

Tensor upsample_nearest2d(const Tensor& x, int64_t out_h, int64_t out_w) {
  return upsample_nearest(x, out_h, out_w, 0);
}

Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeStyle style) {
  KILN_CHECK(x.defined() && x.dim() >= 2,
             "apply_rope: expected x [..., S, D], got "
                 << (x.defined() ? shape_str(x.shape()) : "an undefined tensor"));
  KILN_CHECK(x.dtype() == float32 || x.dtype() == bfloat16 || x.dtype() == float16,
             "apply_rope: expected a float32, bfloat16 or float16 x, got " << x.str());
  const int64_t s = x.size(-2), d = x.size(-1);
  KILN_CHECK(d % 2 == 0, "apply_rope: the last dimension of x " << shape_str(x.shape()) << " must be even");
  for (const Tensor* t : {&cos, &sin}) {
    const char* name = t == &cos ? "cos" : "sin";
    KILN_CHECK(t->defined() && t->dim() >= 2 && t->size(-2) == s && t->size(-1) == d && t->numel() == s * d,
               "apply_rope: " << name << " must be [S, D] = [" << s << ", " << d << "] for x "
                              << shape_str(x.shape()) << ", got "
                              << (t->defined() ? shape_str(t->shape()) : "undefined"));
    KILN_CHECK(is_floating(t->dtype()), "apply_rope: " << name << " must be floating, got " << t->str());
  }
  Tensor x4 = x;
  while (x4.dim() < 4) x4 = x4.unsqueeze(0);
  if (x4.dim() > 4) x4 = x4.flatten(0, x4.dim() - 4);
  if (x4.stride(3) != 1 && d > 1) x4 = x4.contiguous();
  // Like torch's elementwise ops, the output keeps the memory order of a head-split view: q.transpose(1, 2)
  // of a [B, S, H, D] projection gives a [B, H, S, D] result laid out [B, S, H, D], which attention then
  // reads and writes in that order, so that merging the heads afterwards is a view instead of a copy.
  const bool sequence_major =
      x.dim() == 4 && x.size(1) > 1 && x.size(2) > 1 && x.transpose(1, 2).is_contiguous();
  Tensor out = sequence_major
                   ? Tensor::empty({x.size(0), s, x.size(1), d}, x.dtype(), x.device()).transpose(1, 2)
                   : Tensor::empty(x.shape(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  runtime::dispatch(runtime::OpCall{
      "rope",
      {x4, cos.to(float32).contiguous().view({s, d}), sin.to(float32).contiguous().view({s, d})},
      {sequence_major ? out : out.view(x4.shape())},
      runtime::Attrs().set("style", static_cast<int64_t>(style))});
  return out;
}

}  // namespace kiln
