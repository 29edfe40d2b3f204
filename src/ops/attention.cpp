// scaled_dot_product_attention: argument checks, output layout, dispatch of the "attention" op.
#include "kiln/ops/attention.h"

#include <cmath>

#include "runtime/dispatcher.h"

namespace kiln {

namespace {

bool is_attention_dtype(DType d) {
  return d == float32 || d == bfloat16 || d == float16;
}

// Kernels read rows with unit column stride; anything else (rare: a transposed last dim) is copied once.
Tensor unit_last_stride(const Tensor& t) {
  if (t.dim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1) return t;
  return t.contiguous();
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  KILN_CHECK(q.defined() && k.defined() && v.defined(),
             "scaled_dot_product_attention: q, k and v must be defined");
  KILN_CHECK(
      q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
      "scaled_dot_product_attention: expected 4-d q [B, H, Sq, D], k [B, H, Skv, D], v [B, H, Skv, Dv], got "
      "q " << shape_str(q.shape())
           << ", k " << shape_str(k.shape()) << ", v " << shape_str(v.shape()));
  KILN_CHECK(
      q.dtype() == k.dtype() && q.dtype() == v.dtype() && is_attention_dtype(q.dtype()),
      "scaled_dot_product_attention: expected q, k and v of one dtype among float32, bfloat16, float16, got "
          << dtype_name(q.dtype()) << ", " << dtype_name(k.dtype()) << ", " << dtype_name(v.dtype()));
  KILN_CHECK(q.device() == k.device() && q.device() == v.device(),
             "scaled_dot_product_attention: q, k and v must be on one device, got "
                 << q.device().str() << ", " << k.device().str() << ", " << v.device().str());
  const int64_t batch = q.size(0), heads = q.size(1), sq = q.size(2), d = q.size(3);
  const int64_t skv = k.size(2), dv = v.size(3);
  KILN_CHECK(k.size(0) == batch && v.size(0) == batch && k.size(1) == heads && v.size(1) == heads &&
                 k.size(3) == d && v.size(2) == skv,
             "scaled_dot_product_attention: expected k ["
                 << batch << ", " << heads << ", Skv, " << d << "] and v [" << batch << ", " << heads
                 << ", Skv, Dv] for q " << shape_str(q.shape()) << ", got k " << shape_str(k.shape())
                 << ", v " << shape_str(v.shape()));
  KILN_CHECK(d > 0,
             "scaled_dot_product_attention: head size D must be positive, got q " << shape_str(q.shape()));

  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  KILN_CHECK(std::isfinite(scale), "scaled_dot_product_attention: scale must be finite, got " << scale);

  const Shape scores_shape{batch, heads, sq, skv};
  Tensor bias;
  if (options.bias.defined()) {
    const DType bd = options.bias.dtype();
    KILN_CHECK(bd == float32 || bd == bfloat16 || bd == float16 || bd == boolean,
               "scaled_dot_product_attention: bias must be float32, bfloat16, float16 or bool, got "
                   << dtype_name(bd));
    KILN_CHECK(options.bias.dim() <= 4,
               "scaled_dot_product_attention: bias "
                   << shape_str(options.bias.shape())
                   << " is not broadcastable to [B, H, Sq, Skv] = " << shape_str(scores_shape));
    bool broadcastable = true;
    for (int64_t i = 1; i <= options.bias.dim(); ++i) {
      const int64_t s = options.bias.size(-i);
      broadcastable &= s == 1 || s == scores_shape[4 - i];
    }
    KILN_CHECK(broadcastable,
               "scaled_dot_product_attention: bias "
                   << shape_str(options.bias.shape())
                   << " is not broadcastable to [B, H, Sq, Skv] = " << shape_str(scores_shape));
    // Expanding is a view (stride 0 on broadcast dims), so a [1, H, S, S] position bias is not replicated.
    bias = unit_last_stride(options.bias).expand(scores_shape);
  }

  // Like torch, the output follows q's memory order: heads-inside-sequence when q is a head-split view.
  const bool sequence_major = heads > 1 && sq > 1 && q.stride(1) < q.stride(2);
  Tensor out;
  if (sequence_major) {
    out = Tensor::empty({batch, sq, heads, dv}, q.dtype(), q.device()).transpose(1, 2);
  } else {
    out = Tensor::empty({batch, heads, sq, dv}, q.dtype(), q.device());
  }
  if (out.numel() == 0) return out;

  std::vector<Tensor> inputs{unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)};
  if (bias.defined()) inputs.push_back(bias);
  runtime::dispatch(
      runtime::OpCall{"scaled_dot_product_attention",
                      std::move(inputs),
                      {out},
                      runtime::Attrs().set("scale", scale).set("is_causal", options.is_causal)});
  return out;
}

}  // namespace kiln
