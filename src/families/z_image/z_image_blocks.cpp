#include "families/z_image/z_image_blocks.h"

#include <cmath>

#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "models/dit_layers.h"

namespace kiln::models {

namespace {

constexpr double kAttentionNormEps = 1e-5;  // Attention(..., eps=1e-5): the q/k norms' own, not norm_eps

}  // namespace

ZImageAttention::ZImageAttention(int64_t dim, int64_t heads, const nn::TensorParallel& tp)
    : heads_(tp.split(heads, "ZImageTransformer2DModel n_heads")),
      head_dim_(dim / heads),
      to_q_(dim, dim, false, nn::column(tp)),
      to_k_(dim, dim, false, nn::column(tp)),
      to_v_(dim, dim, false, nn::column(tp)),
      to_out_(dim, dim, false, nn::row(tp)),
      norm_q_(dim / heads, kAttentionNormEps),
      norm_k_(dim / heads, kAttentionNormEps) {
  register_module("to_q", &to_q_);
  register_module("to_k", &to_k_);
  register_module("to_v", &to_v_);
  register_module("norm_q", &norm_q_);
  register_module("norm_k", &norm_k_);
  register_module("to_out.0", &to_out_);
}

Tensor ZImageAttention::forward(const Tensor& x, const Tensor& cos, const Tensor& sin) const {
  const auto heads = [&](const nn::Linear& proj) {
    return proj(x).view({x.size(0), x.size(1), heads_, head_dim_});
  };
  return to_out_(rope_attention(norm_q_(heads(to_q_)), norm_k_(heads(to_k_)), heads(to_v_), cos, sin));
}

ZImageFeedForward::ZImageFeedForward(int64_t dim, int64_t hidden, const nn::TensorParallel& tp)
    : w1_(dim, hidden, false, nn::column(tp)),
      w2_(hidden, dim, false, nn::row(tp)),
      w3_(dim, hidden, false, nn::column(tp)) {
  register_module("w1", &w1_);
  register_module("w2", &w2_);
  register_module("w3", &w3_);
}

Tensor ZImageFeedForward::forward(const Tensor& x) const {
  return w2_(mul(silu(w1_(x)), w3_(x)));
}

ZImageTransformerBlock::ZImageTransformerBlock(int64_t dim, int64_t heads, int64_t ffn_hidden,
                                               double norm_eps, bool modulation, int64_t adaln_dim,
                                               const nn::TensorParallel& tp)
    : modulation_(modulation),
      attention_(dim, heads, tp),
      feed_forward_(dim, ffn_hidden, tp),
      attention_norm1_(dim, norm_eps),
      ffn_norm1_(dim, norm_eps),
      attention_norm2_(dim, norm_eps),
      ffn_norm2_(dim, norm_eps) {
  register_module("attention", &attention_);
  register_module("feed_forward", &feed_forward_);
  register_module("attention_norm1", &attention_norm1_);
  register_module("ffn_norm1", &ffn_norm1_);
  register_module("attention_norm2", &attention_norm2_);
  register_module("ffn_norm2", &ffn_norm2_);
  if (modulation) {
    adaln_modulation_ = std::make_unique<nn::Linear>(adaln_dim, 4 * dim, true, nn::column_gathered(tp));
    register_module("adaLN_modulation.0", adaln_modulation_.get());
  }
}

Tensor ZImageTransformerBlock::forward(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                       const Tensor& adaln) const {
  if (!is_compiled()) return forward_eager(x, cos, sin, adaln);
  std::vector<Tensor> inputs{x, cos, sin};
  if (modulation_) inputs.push_back(adaln);
  return call_compiled(inputs, [this](const auto& in) {
    return std::vector<Tensor>{forward_eager(in[0], in[1], in[2], in.size() > 3 ? in[3] : Tensor())};
  })[0];
}

Tensor ZImageTransformerBlock::forward_eager(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                             const Tensor& adaln) const {
  if (!modulation_) {
    const Tensor h = add(x, attention_norm2_(attention_.forward(attention_norm1_(x), cos, sin)));
    return add(h, ffn_norm2_(feed_forward_.forward(ffn_norm1_(h))));
  }
  // scale_msa, gate_msa, scale_mlp, gate_mlp = mod.unsqueeze(1).chunk(4, dim=2), in the compute dtype.
  const std::vector<Tensor> m = chunk((*adaln_modulation_)(adaln.to(x.dtype())).unsqueeze(1), 4, 2);
  const Tensor scale_msa = add(1.0, m[0]), gate_msa = tanh(m[1]);
  const Tensor scale_mlp = add(1.0, m[2]), gate_mlp = tanh(m[3]);
  const Tensor attn = attention_.forward(mul(attention_norm1_(x), scale_msa), cos, sin);
  const Tensor h = add(x, mul(gate_msa, attention_norm2_(attn)));
  return add(h, mul(gate_mlp, ffn_norm2_(feed_forward_.forward(mul(ffn_norm1_(h), scale_mlp)))));
}

ZImageRope z_image_rope(const std::vector<std::array<int64_t, 3>>& ids, const std::vector<int64_t>& axes_dims,
                        double theta) {
  int64_t width = 0;
  for (int64_t d : axes_dims) width += d;
  const auto rows = static_cast<int64_t>(ids.size());
  std::vector<float> cos_values(static_cast<size_t>(rows * width)), sin_values(cos_values.size());
  // Each axis' frequencies: 1 / theta^(arange(0, d, 2) / d), in float64 as RopeEmbedder computes them.
  std::vector<std::vector<double>> freqs;
  for (int64_t d : axes_dims) {
    std::vector<double> f;
    for (int64_t k = 0; k < d; k += 2)
      f.push_back(1.0 / std::pow(theta, static_cast<double>(k) / static_cast<double>(d)));
    freqs.push_back(std::move(f));
  }
  for (int64_t s = 0; s < rows; ++s) {
    int64_t column = 0;
    for (size_t axis = 0; axis < axes_dims.size(); ++axis) {
      for (double f : freqs[axis]) {
        // torch.outer in float64, .float(), then torch.polar in float32.
        const auto angle = static_cast<float>(static_cast<double>(ids[static_cast<size_t>(s)][axis]) * f);
        const auto c = static_cast<float>(std::cos(static_cast<double>(angle)));
        const auto sn = static_cast<float>(std::sin(static_cast<double>(angle)));
        for (int pair = 0; pair < 2; ++pair) {
          cos_values[static_cast<size_t>(s * width + column)] = c;
          sin_values[static_cast<size_t>(s * width + column)] = sn;
          ++column;
        }
      }
    }
  }
  return {Tensor::from_vector(cos_values, {rows, width}), Tensor::from_vector(sin_values, {rows, width})};
}

}  // namespace kiln::models
