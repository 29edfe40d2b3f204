#include "families/chroma/chroma_blocks.h"

#include <limits>
#include <string>

#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"

namespace kiln::models {

namespace {

// The rows [B, n, D] as n views [B, D].
std::vector<Tensor> chunks_of(const Tensor& rows) {
  std::vector<Tensor> out;
  for (int64_t i = 0; i < rows.size(1); ++i) out.push_back(rows.select(1, i));
  return out;
}

// call_compiled's inputs: the block's tensors, the mask's bias when there is one (the traced graph differs).
std::vector<Tensor> with_bias(std::vector<Tensor> inputs, const Tensor& bias) {
  if (bias.defined()) inputs.push_back(bias);
  return inputs;
}

}  // namespace

ChromaApproximator::ChromaApproximator(int64_t in_dim, int64_t out_dim, int64_t hidden_dim, int64_t layers,
                                       const nn::TensorParallel& tp)
    : in_proj_(in_dim, hidden_dim, true), out_proj_(hidden_dim, out_dim, true, nn::column_gathered(tp)) {
  register_module("in_proj", &in_proj_);
  // torch.nn.RMSNorm(eps=None) takes torch.finfo(float32).eps for float32 and bfloat16 inputs alike.
  const double eps = std::numeric_limits<float>::epsilon();
  for (int64_t i = 0; i < layers; ++i) {
    layers_.push_back(std::make_unique<FluxMlpEmbedding>(hidden_dim, hidden_dim, tp));
    register_module("layers." + std::to_string(i), layers_.back().get());
    norms_.push_back(std::make_unique<nn::RMSNorm>(hidden_dim, eps, true, RmsNormStyle::Torch));
    register_module("norms." + std::to_string(i), norms_.back().get());
  }
  register_module("out_proj", &out_proj_);
}

Tensor ChromaApproximator::forward(const Tensor& input) const {
  Tensor x = in_proj_(input);
  for (size_t i = 0; i < layers_.size(); ++i) x = add(x, layers_[i]->forward(norms_[i]->forward(x)));
  return out_proj_(x);
}

Tensor chroma_approximator_input(const Tensor& t, int64_t channels, int64_t rows) {
  const int64_t batch = t.size(0), quarter = channels / 4;
  const DType dtype = t.dtype();
  const Tensor time = flux_timestep_sinusoid(t, quarter).to(dtype);
  // The guidance slot is always the embedding of 0.
  const Tensor guidance =
      flux_timestep_sinusoid(Tensor::zeros({batch}, float32).to(t.device()), quarter).to(dtype);
  std::vector<float> index(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) index[static_cast<size_t>(i)] = static_cast<float>(i * 1000);
  const Tensor modulation_index =
      flux_timestep_sinusoid(Tensor::from_vector(index, {rows}).to(t.device()), 2 * quarter).to(dtype);
  const Tensor per_image = concat({time, guidance}, 1).unsqueeze(1).expand({batch, rows, 2 * quarter});
  return concat({per_image, modulation_index.unsqueeze(0).expand({batch, rows, 2 * quarter})}, 2);
}

ChromaTransformerBlock::ChromaTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim,
                                               const nn::TensorParallel& tp)
    : attn_(dim, heads, head_dim, /*added_kv=*/true, /*pre_only=*/false, tp),
      ff_(dim, 4 * dim, tp),
      ff_context_(dim, 4 * dim, tp) {
  // norm1 and norm1_context are parameterless LayerNorms here.
  register_module("attn", &attn_);
  register_module("ff", &ff_);
  register_module("ff_context", &ff_context_);
}

std::pair<Tensor, Tensor> ChromaTransformerBlock::forward(const Tensor& x, const Tensor& c,
                                                          const Tensor& image_rows, const Tensor& text_rows,
                                                          const FluxRopeTables& rope,
                                                          const Tensor& bias) const {
  if (!is_compiled()) return forward_eager(x, c, image_rows, text_rows, rope, bias);
  const std::vector<Tensor> out = call_compiled(
      with_bias({x, c, image_rows, text_rows, rope.cos, rope.sin}, bias),
      [this](const auto& in) {
        const auto [x1, c1] = forward_eager(in[0], in[1], in[2], in[3], FluxRopeTables{in[4], in[5]},
                                            in.size() > 6 ? in[6] : Tensor());
        return std::vector<Tensor>{x1, c1};
      },
      bias.defined() ? "masked" : "");
  return {out[0], out[1]};
}

std::pair<Tensor, Tensor> ChromaTransformerBlock::forward_eager(const Tensor& x, const Tensor& c,
                                                                const Tensor& image_rows,
                                                                const Tensor& text_rows,
                                                                const FluxRopeTables& rope,
                                                                const Tensor& bias) const {
  return double_stream_block(attn_, ff_, ff_context_, x, c, chunks_of(image_rows), chunks_of(text_rows), rope,
                             bias);
}

ChromaSingleTransformerBlock::ChromaSingleTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim,
                                                           int64_t mlp_hidden, const nn::TensorParallel& tp)
    : proj_mlp_(dim, mlp_hidden, true, nn::column(tp)),
      proj_out_(heads * head_dim + mlp_hidden, dim, true, nn::row(tp, {heads * head_dim, mlp_hidden})),
      attn_(dim, heads, head_dim, /*added_kv=*/false, /*pre_only=*/true, tp) {
  register_module("proj_mlp", &proj_mlp_);
  register_module("proj_out", &proj_out_);
  register_module("attn", &attn_);
}

Tensor ChromaSingleTransformerBlock::forward(const Tensor& s, const Tensor& rows, const FluxRopeTables& rope,
                                             const Tensor& bias) const {
  if (!is_compiled()) return forward_eager(s, rows, rope, bias);
  return call_compiled(
      with_bias({s, rows, rope.cos, rope.sin}, bias),
      [this](const auto& in) {
        return std::vector<Tensor>{
            forward_eager(in[0], in[1], FluxRopeTables{in[2], in[3]}, in.size() > 4 ? in[4] : Tensor())};
      },
      bias.defined() ? "masked" : "")[0];
}

Tensor ChromaSingleTransformerBlock::forward_eager(const Tensor& s, const Tensor& rows,
                                                   const FluxRopeTables& rope, const Tensor& bias) const {
  return single_stream_block(attn_, proj_mlp_, proj_out_, s, chunks_of(rows), rope, bias);
}

}  // namespace kiln::models
