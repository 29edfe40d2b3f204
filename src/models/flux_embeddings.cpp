#include "models/flux_embeddings.h"

#include <cmath>

#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "runtime/dispatcher.h"

namespace kiln::models {

Tensor flux_timestep_sinusoid(const Tensor& t, int64_t dim) {
  KILN_CHECK(t.defined() && t.dim() == 1,
             "FluxTransformer2DModel: the timestep embedding expects a 1-D tensor [B], got "
                 << (t.defined() ? shape_str(t.shape()) : "an undefined tensor"));
  KILN_CHECK(dim > 0 && dim % 2 == 0,
             "FluxTransformer2DModel: the timestep embedding width must be even, got " << dim);
  const int64_t half = dim / 2;
  // torch: exponent = -math.log(10000) * arange(half, float32) / half, exp in float32. The Python double
  // scalar enters a float32 tensor op as a float32, so every step here is float arithmetic.
  const float neg_log_period = static_cast<float>(-std::log(10000.0));
  std::vector<float> freqs(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    freqs[static_cast<size_t>(i)] =
        std::exp(static_cast<float>(i) * neg_log_period / static_cast<float>(half));
  // Kept as tensor ops on t (not host arithmetic) so that the timestep stays an input of the computation.
  const Tensor args = mul(t.to(float32).unsqueeze(1), Tensor::from_vector(freqs, {1, half}).to(t.device()));
  return concat({cos(args), sin(args)}, 1);
}

FluxMlpEmbedding::FluxMlpEmbedding(int64_t in_features, int64_t dim, const nn::TensorParallel& tp, bool bias)
    : linear_1(in_features, dim, bias, nn::column(tp)), linear_2(dim, dim, bias, nn::row(tp)) {
  register_module("linear_1", &linear_1);
  register_module("linear_2", &linear_2);
}

Tensor FluxMlpEmbedding::forward(const Tensor& x) const {
  return linear_2(silu(linear_1(x)));
}

FluxTimeTextEmbedding::FluxTimeTextEmbedding(int64_t dim, int64_t pooled_dim, bool guidance_embeds,
                                             const nn::TensorParallel& tp)
    : timestep_embedder_(256, dim, tp), text_embedder_(pooled_dim, dim, tp) {
  register_module("timestep_embedder", &timestep_embedder_);
  if (guidance_embeds) {
    guidance_embedder_ = std::make_unique<FluxMlpEmbedding>(256, dim, tp);
    register_module("guidance_embedder", guidance_embedder_.get());
  }
  register_module("text_embedder", &text_embedder_);
}

Tensor FluxTimeTextEmbedding::forward(const Tensor& timestep, const Tensor& guidance,
                                      const Tensor& pooled) const {
  Tensor temb = timestep_embedder_.forward(flux_timestep_sinusoid(timestep, 256).to(pooled.dtype()));
  if (guidance_embedder_)
    temb = add(temb, guidance_embedder_->forward(flux_timestep_sinusoid(guidance, 256).to(pooled.dtype())));
  return add(temb, text_embedder_.forward(pooled));
}

FluxRopeTables flux_rope_tables(const Tensor& ids, const std::vector<int64_t>& axes_dims, double theta) {
  const int64_t n_axes = static_cast<int64_t>(axes_dims.size());
  KILN_CHECK(ids.defined() && ids.dim() == 2 && ids.size(1) == n_axes,
             "FluxTransformer2DModel: position ids must be [S, "
                 << n_axes << "] (one column per RoPE axis), got "
                 << (ids.defined() ? shape_str(ids.shape()) : "undefined"));
  int64_t head_dim = 0;
  for (int64_t d : axes_dims) {
    KILN_CHECK(d > 0 && d % 2 == 0,
               "FluxTransformer2DModel: every RoPE axis dim must be even and positive, got "
                   << shape_str(axes_dims));
    head_dim += d;
  }
  const int64_t seq = ids.size(0);
  // diffusers reads the ids as float32 (ids.float()); the tables are computed by an op (a kernel reads the
  // ids), so a traced forward never reads tensor values on the host.
  Tensor cos_t = Tensor::empty({seq, head_dim}, float32, ids.device());
  Tensor sin_t = Tensor::empty({seq, head_dim}, float32, ids.device());
  runtime::dispatch(runtime::OpCall{"flux_rope_tables",
                                    {ids.to(float32).contiguous()},
                                    {cos_t, sin_t},
                                    runtime::Attrs().set("axes_dims", axes_dims).set("theta", theta)});
  return {cos_t, sin_t};
}

}  // namespace kiln::models
