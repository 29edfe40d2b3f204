// Layers the diffusion transformers share (FLUX.1, SD3, FLUX.2), with diffusers' parameter names: the
// adaptive-norm modulation (linear(silu(temb)) split into shift/scale/gate chunks), the parameterless layer
// norm and the modulation/gating arithmetic around it, AdaLayerNormContinuous (norm_out), the GELU-tanh
// feed-forward, the rotary attention core of joint attention, and the float16 clip. Each rounds op by op
// where diffusers does, so bfloat16 models give diffusers' bfloat16 results.
//
// Modules take silu(temb) rather than temb: each adaptive norm of diffusers computes linear(silu(temb)) from
// the same temb, so computing the SiLU once per forward gives identical values.
//
// Tensor-parallel plan (kiln/nn/tensor_parallel.h), shared by every DiT here: attention projections into
// heads column-parallel (each rank attends over its own heads), output projections row-parallel; feed-forward
// in column-, out row-parallel; the modulation and norm_out projections column-parallel and gathered (their
// [B, chunks * dim] outputs are tiny next to their weights).
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/nn/layers.h"

namespace kiln::models {

// nn.LayerNorm(dim, elementwise_affine=False, eps): every block norm of the three DiTs (eps 1e-6 in all real
// configs; FLUX.2 reads it from its config).
Tensor layer_norm_plain(const Tensor& x, double eps = 1e-6);
// normed * (1 + scale[:, None]) + shift[:, None] for scale, shift [B, D], rounded op by op as diffusers is.
Tensor modulate(const Tensor& normed, const Tensor& scale, const Tensor& shift);
// x + gate[:, None] * y for gate [B, D].
Tensor gated_residual(const Tensor& x, const Tensor& gate, const Tensor& y);
// diffusers clips float16 streams to +-65504 so that an overflow saturates; other dtypes pass through.
Tensor clip_if_float16(const Tensor& x);
// The core of the FLUX attention processors: interleaved-pair RoPE on q and k [B, S, H, D] (cos/sin
// [S, D] float32), scaled dot-product attention (`bias`, optional, added to the scores), heads merged back
// -> [B, S, H * D] (head-major features).
Tensor rope_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos, const Tensor& sin,
                      const Tensor& bias = {});

// The modulation projection of AdaLayerNormZero / AdaLayerNormZeroSingle / Flux2Modulation:
// linear(silu(temb)) [B, chunks * dim], split into `chunks` views [B, dim] in diffusers' order.
class Modulation : public nn::Module {
 public:
  Modulation(int64_t dim, int64_t chunks, bool bias, const nn::TensorParallel& tp = {});
  std::vector<Tensor> forward(const Tensor& silu_temb) const;
  // The projection alone, unsplit: [B, chunks * dim].
  Tensor project(const Tensor& silu_temb) const { return linear(silu_temb); }
  int64_t chunks() const { return chunks_; }
  nn::Linear linear;

 private:
  int64_t chunks_;
};

// AdaLayerNormContinuous(dim, dim, elementwise_affine=False, eps): norm_out of FLUX and SD3, the context norm
// of SD3's last block. Scale comes first in diffusers' files.
class AdaLayerNormContinuous : public nn::Module {
 public:
  AdaLayerNormContinuous(int64_t dim, bool bias, const nn::TensorParallel& tp = {}, double eps = 1e-6);
  Tensor forward(const Tensor& x, const Tensor& silu_temb) const;

 private:
  nn::Linear linear_;
  double eps_;
};

// FeedForward(dim, dim_out=dim, activation_fn="gelu-approximate"): net.0.proj -> gelu(tanh) -> net.2.
class GeluTanhFeedForward : public nn::Module {
 public:
  GeluTanhFeedForward(int64_t dim, int64_t hidden, const nn::TensorParallel& tp = {});
  Tensor forward(const Tensor& x) const;

 private:
  nn::Linear proj_, out_;  // registered as net.0.proj and net.2 (net.1 is a parameterless Dropout)
};

}  // namespace kiln::models
