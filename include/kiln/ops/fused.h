// Fused ops that replace chains of the DiT blocks' ops with one kernel: a linear layer with its epilogue
// (activation, gate, residual) and a norm with its adaLN modulation. Models never call these directly: the
// DeferAndFuse flush and compiled graphs substitute them for the chains they match. Each is defined as the
// unfused chain it replaces, computed in float32 and rounded ONCE to the output dtype, where the chain
// rounds after every op. In float32 the two agree to float32 rounding (tests: 1e-5 relative); in bfloat16
// and float16 they differ by the chain's intermediate roundings, so the fused result is the more exact one
// (tolerances below, measured in tests/ops/fused_test.cpp).
#pragma once

#include "kiln/core/tensor.h"

namespace kiln {

// The activation applied to x @ w^T + bias (the same functions as kiln::gelu/gelu(Tanh)/silu).
enum class Activation { None, Gelu, GeluTanh, Silu };

// What linear_fused does after the product. Undefined tensors are absent.
struct LinearEpilogue {
  Activation act = Activation::None;
  // Multiplies act(...); broadcast to the output [..., N] by torch's rules, for example [B, 1, N] over
  // [B, S, N] (adaLN's gate). Same dtype as x.
  Tensor gate;
  // Added last; exactly the output's shape, same dtype as x.
  Tensor residual;
  // A low-rank product added to x @ w^T before the activation: (x @ down^T) @ up^T with down [R, K] and up
  // [N, R] in x's dtype (a LoRA adapter's pair beside the base weight, which stays as it is). Both products
  // are rounded to x's dtype, as PEFT's lora_B(lora_A(x)) is, and the sum is taken in float32 inside the
  // product's accumulation; not float16. Both or neither.
  Tensor low_rank_down, low_rank_up;
};

// out = residual + gate * act(x @ w^T + bias [+ (x @ down^T) @ up^T]), i.e. the chain
//   add(residual, mul(gate, act(add(linear(x, w, bias), linear(linear(x, down), up)))))
// with x [..., K], w [N, K] (as kiln::linear; the same prepacked copy of w is used, never a second one),
// bias [N] (x's dtype or float32, may be undefined), output [..., N] in x's dtype. Everything after the
// float32 accumulation runs in float32 inside oneDNN's epilogue (post-ops) and is rounded once.
// Against the unfused chain in bfloat16, which rounds the product, the activation and the gated product to
// bfloat16 on the way, results differ by a few bfloat16 ulps of the largest term: |fused - unfused| <=
// 2^-6 * max|out| + 2^-6 * |out| (fused_test.cpp; on FLUX-sized random data the largest difference was
// 3e-3 to 5e-3 of max|out|); against float32 math on the same bfloat16 inputs the fused result is within
// one bfloat16 ulp. In float32 it matches the chain to 1e-7 of max|out| (bit for bit without activation).
// float16 is computed in float32 as kiln::linear does.
Tensor linear_fused(const Tensor& x, const Tensor& w, const Tensor& bias, const LinearEpilogue& epilogue);

enum class NormKind { LayerNorm, RmsNorm };

// norm(x) * (1 + scale) + shift over the last dim of x [..., C] (typically [B, S, C]), where norm is
// layer_norm without affine (LayerNorm) or rms_norm without weight (RmsNorm), and scale/shift broadcast to
// x by torch's rules ([B, 1, C], [1, C], [C], ...; any floating dtype). Statistics and the modulation run in
// float32 in one kernel pass per row; the output, in x's dtype, is rounded once. The unfused chain
//   add(mul(layer_norm(x), add(1, scale)), shift)
// rounds norm(x), 1 + scale, the product and the sum to bfloat16 in a bf16 model; this op differs from it
// by at most 2^-6 * max|out| + 2^-6 * |out| there (fused_test.cpp; 8e-3 of max|out| at most on FLUX-sized
// random data), and by float32 rounding (1e-7 of max|out|) in float32.
Tensor norm_modulate(const Tensor& x, const Tensor& scale, const Tensor& shift, NormKind kind, double eps);

}  // namespace kiln
