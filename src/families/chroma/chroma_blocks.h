// The parts of ChromaTransformer2DModel that are not FLUX.1's: the distilled-guidance approximator, which
// makes every block's modulation from the timestep, and the two block kinds fed with those vectors instead of
// projecting their own (their attention and feed-forwards are FLUX.1's, models/flux_blocks.h).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kiln/nn/layers.h"
#include "models/dit_layers.h"
#include "models/flux_blocks.h"
#include "models/flux_embeddings.h"

namespace kiln::models {

// ChromaApproximator (distilled_guidance_layer): in_proj, then `layers` residual MLPs each behind a
// torch.nn.RMSNorm (eps None: float32's epsilon, 2^-23), then out_proj to the model width.
class ChromaApproximator : public nn::Module {
 public:
  ChromaApproximator(int64_t in_dim, int64_t out_dim, int64_t hidden_dim, int64_t layers,
                     const nn::TensorParallel& tp = {});
  // [B, M, in_dim] -> [B, M, out_dim].
  Tensor forward(const Tensor& input) const;

 private:
  nn::Linear in_proj_, out_proj_;
  std::vector<std::unique_ptr<FluxMlpEmbedding>> layers_;  // linear_1 -> SiLU -> linear_2
  std::vector<std::unique_ptr<nn::RMSNorm>> norms_;
};

// ChromaCombinedTimestepTextProjEmbeddings: the approximator's input for t [B] (already scaled by 1000, in
// the compute dtype): row i of [B, rows, 4C] is [sinusoid(t) (C), sinusoid(0) (C), sinusoid(1000 i) (2C)],
// each computed in float32 and cast to t's dtype, C = channels / 4.
Tensor chroma_approximator_input(const Tensor& t, int64_t channels, int64_t rows);

// ChromaTransformerBlock: FluxTransformerBlock whose twelve modulation vectors are given, image_rows and
// text_rows [B, 6, D] each (shift, scale, gate of the attention, then of the MLP).
class ChromaTransformerBlock : public nn::Module {
 public:
  ChromaTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, const nn::TensorParallel& tp = {});
  // `bias`: the attention mask's m_i * m_j [B, 1, S, S], or undefined.
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& image_rows,
                                    const Tensor& text_rows, const FluxRopeTables& rope,
                                    const Tensor& bias) const;
  bool supports_compile() const override { return true; }
  // The step cache that may forecast, broadcast or extrapolate attn's (image, text) outputs (TaylorSeer, PAB,
  // FasterCache on transformer_blocks.N.attn); null: none.
  void use_step_cache(nn::StepCache* cache) { attn_.use_step_cache(cache); }

 private:
  std::pair<Tensor, Tensor> forward_eager(const Tensor& x, const Tensor& c, const Tensor& image_rows,
                                          const Tensor& text_rows, const FluxRopeTables& rope,
                                          const Tensor& bias) const;
  FluxAttention attn_;
  GeluTanhFeedForward ff_, ff_context_;
};

// ChromaSingleTransformerBlock: FluxSingleTransformerBlock with its three vectors given, rows [B, 3, D].
class ChromaSingleTransformerBlock : public nn::Module {
 public:
  ChromaSingleTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, int64_t mlp_hidden,
                               const nn::TensorParallel& tp = {});
  Tensor forward(const Tensor& s, const Tensor& rows, const FluxRopeTables& rope, const Tensor& bias) const;
  bool supports_compile() const override { return true; }
  // As ChromaTransformerBlock's, on single_transformer_blocks.N.attn (its output before proj_out).
  void use_step_cache(nn::StepCache* cache) { attn_.use_step_cache(cache); }

 private:
  Tensor forward_eager(const Tensor& s, const Tensor& rows, const FluxRopeTables& rope,
                       const Tensor& bias) const;
  nn::Linear proj_mlp_, proj_out_;
  FluxAttention attn_;
};

}  // namespace kiln::models
