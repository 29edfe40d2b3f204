// Front ends of the fused ops (kiln/ops/fused.h): argument checks, and the reduction of every broadcast
// operand to a small dense table the kernels index by row block. Kernels: src/backends/cpu/fused_*.cpp.
#include "kiln/ops/fused.h"

#include <algorithm>
#include <vector>

#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/memory_policy.h"
#include "runtime/dispatcher.h"

namespace kiln {

namespace {

// Below this many rows per gate row, one oneDNN call per block costs more than materialising the gate at the
// output's size (an extra pass over [M, N] of the gate): per-call overhead is ~10 us, a 16-row block of a
// DiT-sized product 0.1-1 ms.
constexpr int64_t kMinRowsPerGateBlock = 16;

bool is_kernel_float(DType d) {
  return d == float32 || d == bfloat16 || d == float16;
}

void check_float(const char* op, const char* name, const Tensor& t) {
  KILN_CHECK(t.defined(), op << ": " << name << " is an undefined tensor");
  KILN_CHECK(is_kernel_float(t.dtype()), op << ": " << name << " must be float32, bfloat16 or float16, got "
                                            << dtype_name(t.dtype()) << " " << shape_str(t.shape()));
}

// `t`'s shape with leading 1s up to `rank` dims.
Shape padded_shape(const Tensor& t, size_t rank) {
  Shape s(rank - t.shape().size(), 1);
  s.insert(s.end(), t.shape().begin(), t.shape().end());
  return s;
}

// torch's broadcasting, restricted to operands that do not enlarge `target`.
void check_broadcasts_to(const char* op, const char* name, const Tensor& t, const Shape& target) {
  bool ok = t.dim() <= static_cast<int64_t>(target.size());
  if (ok) {
    const Shape p = padded_shape(t, target.size());
    for (size_t d = 0; d < target.size(); ++d) ok = ok && (p[d] == 1 || p[d] == target[d]);
  }
  KILN_CHECK(ok, op << ": " << name << " " << shape_str(t.shape()) << " does not broadcast to "
                    << shape_str(target));
}

// Rows of a [..., C] output are grouped into blocks of consecutive rows that share one row of every
// broadcast operand: a block spans the leading dims after the last one any operand varies in. For adaLN's
// [B, 1, C] over [B, S, C] that is dim 1: S rows per block, B blocks. Returns the block's first dim.
size_t block_first_dim(const Shape& shape, const std::vector<const Tensor*>& operands) {
  const size_t rank = shape.size();
  size_t first = 0;
  for (const Tensor* t : operands) {
    const Shape p = padded_shape(*t, rank);
    for (size_t d = 0; d + 1 < rank; ++d)
      if (p[d] != 1) first = std::max(first, d + 1);
  }
  return first;
}

int64_t block_rows(const Shape& shape, size_t first) {
  int64_t rows = 1;
  for (size_t d = first; d + 1 < shape.size(); ++d) rows *= shape[d];
  return rows;
}

// The rows of broadcast operand `t` (to `shape`) that the blocks starting at dim `first` use, as a dense
// [blocks, width] tensor of `dtype`; width is 1 when `t` does not vary along the last dim, else shape's.
Tensor block_table(const Tensor& t, const Shape& shape, size_t first, DType dtype) {
  const size_t rank = shape.size();
  const Shape p = padded_shape(t, rank);
  Shape target = shape;
  for (size_t d = first; d + 1 < rank; ++d) target[d] = 1;
  target.back() = p.back();
  const int64_t blocks = shape_numel(target) / target.back();
  return t.to(dtype).reshape(p).expand(target).contiguous().view({blocks, target.back()});
}

// oneDNN takes a matrix whose last two dims are row- or column-major with any leading dimension.
Tensor matrix_operand(const Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1), rs = t.stride(0), cs = t.stride(1);
  const bool row_major = (cols == 1 || cs == 1) && (rows == 1 || rs >= cols);
  const bool col_major = (rows == 1 || rs == 1) && (cols == 1 || cs >= rows);
  return row_major || col_major ? t : t.contiguous();
}

// The epilogue applied to the float32 value v (an empty-K product is the bias alone), in float32.
Tensor epilogue_in_float(Tensor v, const LinearEpilogue& e) {
  switch (e.act) {
    case Activation::None:
      break;
    case Activation::Gelu:
      v = gelu(v);
      break;
    case Activation::GeluTanh:
      v = gelu(v, GeluApproximate::Tanh);
      break;
    case Activation::Silu:
      v = silu(v);
      break;
  }
  if (e.gate.defined()) v = mul(v, e.gate.to(float32));
  if (e.residual.defined()) v = add(v, e.residual.to(float32));
  return v;
}

}  // namespace

Tensor linear_fused(const Tensor& x, const Tensor& w, const Tensor& bias, const LinearEpilogue& epilogue) {
  const char* op = "linear_fused";
  check_float(op, "x", x);
  check_float(op, "weight", w);
  KILN_CHECK(w.dim() == 2,
             op << ": expected weight [out_features, in_features], got " << shape_str(w.shape()));
  KILN_CHECK(x.dim() >= 1, op << ": expected x [..., in_features], got a 0-d tensor");
  KILN_CHECK(x.dtype() == w.dtype(), op << ": x " << shape_str(x.shape()) << " is " << dtype_name(x.dtype())
                                        << " but weight " << shape_str(w.shape()) << " is "
                                        << dtype_name(w.dtype()));
  const int64_t n = w.size(0), k = w.size(1);
  KILN_CHECK(x.size(-1) == k, op << ": x " << shape_str(x.shape()) << " has " << x.size(-1)
                                 << " features but weight " << shape_str(w.shape()) << " expects " << k);
  if (bias.defined()) {
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == n,
               op << ": expected bias [" << n << "], got " << shape_str(bias.shape()));
    KILN_CHECK(bias.dtype() == x.dtype() || bias.dtype() == float32,
               op << ": bias is " << dtype_name(bias.dtype()) << " but x is " << dtype_name(x.dtype())
                  << "; expected the same dtype or float32");
  }
  const int act = static_cast<int>(epilogue.act);
  KILN_CHECK(act >= 0 && act <= static_cast<int>(Activation::Silu),
             op << ": unknown activation " << act << " (expected None, Gelu, GeluTanh or Silu)");
  Shape out_shape = x.shape();
  out_shape.back() = n;
  const Tensor& gate = epilogue.gate;
  const Tensor& residual = epilogue.residual;
  if (gate.defined()) {
    KILN_CHECK(gate.dtype() == x.dtype(), op << ": gate " << shape_str(gate.shape()) << " is "
                                             << dtype_name(gate.dtype()) << " but x is "
                                             << dtype_name(x.dtype()) << "; expected the same dtype");
    check_broadcasts_to(op, "gate", gate, out_shape);
  }
  const Tensor& down = epilogue.low_rank_down;
  const Tensor& up = epilogue.low_rank_up;
  KILN_CHECK(down.defined() == up.defined(), op << ": the low-rank pair needs both down and up, got only "
                                                << (down.defined() ? "down" : "up"));
  if (down.defined()) {
    KILN_CHECK(x.dtype() != float16, op << ": no low-rank product in float16 (float32 and bfloat16 only)");
    KILN_CHECK(down.dtype() == x.dtype() && up.dtype() == x.dtype(),
               op << ": the low-rank pair is " << dtype_name(down.dtype()) << " and "
                  << dtype_name(up.dtype()) << " but x is " << dtype_name(x.dtype())
                  << "; expected the same dtype");
    KILN_CHECK(down.dim() == 2 && up.dim() == 2 && down.size(1) == k && up.size(0) == n &&
                   up.size(1) == down.size(0) && down.size(0) > 0,
               op << ": a " << k << " -> " << n << " product takes down [R, " << k << "] and up [" << n
                  << ", R], got down " << shape_str(down.shape()) << " and up " << shape_str(up.shape()));
  }
  if (residual.defined()) {
    KILN_CHECK(residual.dtype() == x.dtype(), op << ": residual " << shape_str(residual.shape()) << " is "
                                                 << dtype_name(residual.dtype()) << " but x is "
                                                 << dtype_name(x.dtype()) << "; expected the same dtype");
    KILN_CHECK(residual.shape() == out_shape, op << ": residual must have the output's shape "
                                                 << shape_str(out_shape) << ", got "
                                                 << shape_str(residual.shape()));
  }

  int64_t m = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) m *= x.size(d);
  if (k == 0) {
    // No product: the epilogue of the bias (or zeros), in float32 and rounded once like the kernel.
    Tensor v = Tensor::zeros(out_shape, float32, x.device());
    if (bias.defined()) v = add(v, bias.to(float32));
    return epilogue_in_float(v, epilogue).to(x.dtype());
  }
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  if (m == 0 || n == 0) return out;

  std::vector<Tensor> inputs{matrix_operand(x.reshape({m, k})), matrix_operand(w)};
  if (bias.defined()) inputs.push_back(bias.contiguous());
  if (gate.defined()) {
    size_t first = block_first_dim(out_shape, {&gate});
    // Gate rows that change every few output rows: one product with the gate at full size instead.
    const int64_t rows = block_rows(out_shape, first);
    if (rows < kMinRowsPerGateBlock && rows < m) first = out_shape.size() - 1;
    Tensor table = block_table(gate, out_shape, first, x.dtype());
    if (table.size(0) == m && m > 1) table = table.expand({m, n}).contiguous();
    inputs.push_back(table);
  }
  if (residual.defined()) inputs.push_back(residual.contiguous().view({m, n}));
  if (down.defined()) {
    inputs.push_back(matrix_operand(down));
    inputs.push_back(matrix_operand(up));
  }
  runtime::dispatch(runtime::OpCall{"linear_fused",
                                    std::move(inputs),
                                    {out.view({m, n})},
                                    runtime::Attrs()
                                        .set("act", int64_t{act})
                                        .set("has_bias", bias.defined())
                                        .set("has_gate", gate.defined())
                                        .set("has_residual", residual.defined())
                                        .set("has_low_rank", down.defined())
                                        .set("prepack", weight_is_prepacked(w.dtype()))});
  return out;
}

Tensor norm_modulate(const Tensor& x, const Tensor& scale, const Tensor& shift, NormKind kind, double eps) {
  const char* op = "norm_modulate";
  check_float(op, "x", x);
  check_float(op, "scale", scale);
  check_float(op, "shift", shift);
  KILN_CHECK(x.dim() >= 1, op << ": expected x [..., C], got a 0-d tensor");
  KILN_CHECK(kind == NormKind::LayerNorm || kind == NormKind::RmsNorm,
             op << ": unknown norm kind " << static_cast<int>(kind) << " (expected LayerNorm or RmsNorm)");
  KILN_CHECK(eps >= 0, op << ": eps must be >= 0, got " << eps);
  check_broadcasts_to(op, "scale", scale, x.shape());
  check_broadcasts_to(op, "shift", shift, x.shape());
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() == 0) return out;
  const int64_t c = x.size(-1), rows = x.numel() / c;
  const size_t first = block_first_dim(x.shape(), {&scale, &shift});
  // Per-channel float32 tables [blocks, C]: B x C floats for adaLN, however long the sequence.
  const auto table = [&](const Tensor& t) {
    const Tensor tb = block_table(t, x.shape(), first, float32);
    return tb.size(1) == c ? tb : tb.expand({tb.size(0), c}).contiguous();
  };
  runtime::dispatch(runtime::OpCall{"norm_modulate",
                                    {x.contiguous().view({rows, c}), table(scale), table(shift)},
                                    {out.view({rows, c})},
                                    runtime::Attrs()
                                        .set("kind", static_cast<int64_t>(kind))
                                        .set("eps", eps)
                                        .set("block_rows", block_rows(x.shape(), first))});
  return out;
}

}  // namespace kiln
