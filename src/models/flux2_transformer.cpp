#include "kiln/models/flux2_transformer.h"

#include <algorithm>
#include <tuple>

#include "kiln/nn/checkpoint_weights.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "models/dit_layers.h"
#include "models/flux2_blocks.h"
#include "models/flux_embeddings.h"

namespace kiln::models {

namespace {

std::string describe(const Tensor& t) {
  return t.defined() ? t.str() : std::string("undefined");
}

// _prepare_image_ids(scale=10): the i-th reference image sits at time coordinate 10 + 10 i.
constexpr int64_t kReferenceTimeScale = 10;

}  // namespace

Flux2Transformer2DModel::Flux2Transformer2DModel(const Flux2TransformerConfig& config,
                                                 const nn::TensorParallel& tp)
    : config_((config.validate("Flux2Transformer2DModel config"), config)),
      x_embedder_(config.in_channels, config.inner_dim(), false, nn::column_gathered(tp)),
      context_embedder_(config.joint_attention_dim, config.inner_dim(), false, nn::column_gathered(tp)),
      proj_out_(config.inner_dim(), config.patch_size * config.patch_size * config.out_channels, false,
                nn::column_gathered(tp)) {
  const int64_t dim = config.inner_dim();
  time_guidance_embed_ = std::make_unique<Flux2TimeGuidanceEmbedding>(config.timestep_guidance_channels, dim,
                                                                      config.guidance_embeds, tp);
  register_module("time_guidance_embed", time_guidance_embed_.get());
  // Two (shift, scale, gate) sets for the double-stream attention and feed-forward, one for the single
  // stream.
  double_stream_modulation_img_ = std::make_unique<Modulation>(dim, 6, /*bias=*/false, tp);
  double_stream_modulation_txt_ = std::make_unique<Modulation>(dim, 6, /*bias=*/false, tp);
  single_stream_modulation_ = std::make_unique<Modulation>(dim, 3, /*bias=*/false, tp);
  register_module("double_stream_modulation_img", double_stream_modulation_img_.get());
  register_module("double_stream_modulation_txt", double_stream_modulation_txt_.get());
  register_module("single_stream_modulation", single_stream_modulation_.get());
  register_module("x_embedder", &x_embedder_);
  register_module("context_embedder", &context_embedder_);
  const int64_t heads = config.num_attention_heads, head_dim = config.attention_head_dim;
  const int64_t mlp = config.mlp_hidden_dim();
  for (int64_t i = 0; i < config.num_layers; ++i) {
    transformer_blocks_.push_back(
        std::make_unique<Flux2TransformerBlock>(dim, heads, head_dim, mlp, config.eps, tp));
    register_module("transformer_blocks." + std::to_string(i), transformer_blocks_.back().get());
    transformer_blocks_.back()->use_step_cache(&step_cache_);  // TaylorSeer forecasts the attentions
  }
  for (int64_t i = 0; i < config.num_single_layers; ++i) {
    single_transformer_blocks_.push_back(
        std::make_unique<Flux2SingleTransformerBlock>(dim, heads, head_dim, mlp, config.eps, tp));
    register_module("single_transformer_blocks." + std::to_string(i),
                    single_transformer_blocks_.back().get());
    single_transformer_blocks_.back()->use_step_cache(&step_cache_);
  }
  step_cache_.set_refusal([](const StepCacheConfig& cache) {
    return std::holds_alternative<FirstBlockCacheConfig>(cache) ? flux2_first_block_cache_refusal()
                                                                : std::string();
  });
  // No magnitude ratios are published for FLUX.2 (diffusers ships FLUX.1-dev's only): MagCache needs the
  // call's own (measured with magcache:calibrate), and one without is refused by name.
  norm_out_ = std::make_unique<AdaLayerNormContinuous>(dim, /*bias=*/false, tp, config.eps);
  register_module("norm_out", norm_out_.get());
  register_module("proj_out", &proj_out_);
}

Flux2Transformer2DModel::~Flux2Transformer2DModel() = default;

Tensor Flux2Transformer2DModel::forward(const Tensor& hidden, const Tensor& encoder_hidden,
                                        const Tensor& timestep, const Tensor& guidance, const Tensor& txt_ids,
                                        const Tensor& img_ids, Flux2TransformerTrace* trace) const {
  std::vector<Tensor> inputs{hidden, encoder_hidden, timestep, guidance, txt_ids, img_ids};
  for (Tensor& t : inputs) t = on_weights_device(t);
  // A step cache decides between the blocks, on the host: the whole forward cannot be one program then (the
  // pipelines refuse a cache in compile mode; compile-blocks compiles the blocks and leaves it the decision).
  if (!is_compiled() || step_cache_.active())
    return forward_eager(inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], inputs[5], trace);
  KILN_CHECK(
      trace == nullptr,
      "Flux2Transformer2DModel: a compiled forward cannot record its stages; trace an uncompiled model");
  return call_compiled(inputs, [this](const auto& in) {
    return std::vector<Tensor>{forward_eager(in[0], in[1], in[2], in[3], in[4], in[5], nullptr)};
  })[0];
}

std::vector<nn::BlockList> Flux2Transformer2DModel::repeated_blocks() const {
  return {nn::block_list("transformer_blocks", transformer_blocks_),
          nn::block_list("single_transformer_blocks", single_transformer_blocks_)};
}

Tensor Flux2Transformer2DModel::forward_eager(const Tensor& hidden, const Tensor& encoder_hidden,
                                              const Tensor& timestep, const Tensor& guidance,
                                              const Tensor& txt_ids, const Tensor& img_ids,
                                              Flux2TransformerTrace* trace) const {
  const Flux2TransformerConfig& c = config_;
  const char* op = "Flux2Transformer2DModel";
  KILN_CHECK(x_embedder_.weight.defined(), op << ": the weights are not loaded (call load_weights first)");
  KILN_CHECK(hidden.defined() && hidden.dim() == 3 && hidden.size(2) == c.in_channels,
             op << ": expected hidden_states [B, N, " << c.in_channels << "], got " << describe(hidden));
  const int64_t batch = hidden.size(0), image = hidden.size(1);
  const DType dtype = x_embedder_.dtype();
  KILN_CHECK(hidden.dtype() == dtype, op << ": hidden_states is " << dtype_name(hidden.dtype())
                                         << " but the weights are " << dtype_name(dtype)
                                         << "; the model computes in its weights' dtype");
  KILN_CHECK(encoder_hidden.defined() && encoder_hidden.dim() == 3 && encoder_hidden.size(0) == batch &&
                 encoder_hidden.size(2) == c.joint_attention_dim && encoder_hidden.dtype() == dtype,
             op << ": expected encoder_hidden_states [" << batch << ", L, " << c.joint_attention_dim << "] "
                << dtype_name(dtype) << ", got " << describe(encoder_hidden));
  const int64_t text = encoder_hidden.size(1);
  KILN_CHECK(
      timestep.defined() && timestep.dim() == 1 && timestep.size(0) == batch && is_floating(timestep.dtype()),
      op << ": expected a floating timestep [" << batch << "], got " << describe(timestep));
  KILN_CHECK(!guidance.defined() ||
                 (guidance.dim() == 1 && guidance.size(0) == batch && is_floating(guidance.dtype())),
             op << ": expected a floating guidance [" << batch << "] or none, got " << describe(guidance));
  const auto axes = static_cast<int64_t>(c.axes_dims_rope.size());
  KILN_CHECK(txt_ids.defined() && txt_ids.dim() == 2 && txt_ids.size(0) == text && txt_ids.size(1) == axes,
             op << ": expected txt_ids [" << text << ", " << axes << "], got " << describe(txt_ids));
  KILN_CHECK(img_ids.defined() && img_ids.dim() == 2 && img_ids.size(0) == image && img_ids.size(1) == axes,
             op << ": expected img_ids [" << image << ", " << axes << "], got " << describe(img_ids));

  // diffusers: timestep.to(hidden_states.dtype) * 1000 (likewise guidance), each step rounded to that dtype.
  const Tensor t = mul(timestep.to(dtype), 1000.0);
  const Tensor g = guidance.defined() ? mul(guidance.to(dtype), 1000.0) : Tensor();
  const Tensor temb = time_guidance_embed_->forward(t, g);
  // The shared modulations: Flux2Modulation is linear(silu(temb)), one SiLU for all three.
  const Tensor silu_temb = silu(temb);
  const Tensor mod_img = double_stream_modulation_img_->project(silu_temb);
  const Tensor mod_txt = double_stream_modulation_txt_->project(silu_temb);
  const Tensor mod_single = single_stream_modulation_->project(silu_temb);

  Tensor x = x_embedder_(hidden);
  Tensor ctx = context_embedder_(encoder_hidden);
  if (trace) *trace = {temb, mod_img, mod_txt, mod_single, x, ctx, {}, {}, {}};
  // The text table first, then the image table (Flux2PosEmbed per stream, concatenated): the tables of
  // concat(txt_ids, img_ids), row by row the same values.
  const FluxRopeTables rope =
      flux_rope_tables(concat({txt_ids.to(float32), img_ids.to(float32)}, 0), c.axes_dims_rope, c.rope_theta);

  // Blocks [first, last) of the double-stream blocks followed by the single-stream ones, as the step cache
  // asks for them. The single-stream blocks see [text; image], concatenated once as diffusers does; the
  // streams handed back are its image rows (the noise's and the reference images') and its text rows.
  const size_t doubles = transformer_blocks_.size();
  const auto run_blocks = [&](size_t first, size_t last, const nn::BlockStreams& in) {
    Tensor x = in.image, ctx = in.text;
    for (size_t i = first; i < std::min(last, doubles); ++i) {
      std::tie(x, ctx) = transformer_blocks_[i]->forward(x, ctx, mod_img, mod_txt, rope);
      if (trace) trace->double_blocks.emplace_back(ctx, x);
    }
    if (last <= doubles) return nn::BlockStreams{x, ctx};
    Tensor joint = concat({ctx, x}, 1);
    for (size_t i = std::max(first, doubles); i < last; ++i) {
      joint = single_transformer_blocks_[i - doubles]->forward(joint, mod_single, rope);
      if (trace) trace->single_blocks.push_back(joint);
    }
    return nn::BlockStreams{joint.narrow(1, text, image), joint.narrow(1, 0, text)};
  };
  x = step_cache_.run(doubles + single_transformer_blocks_.size(), {x, ctx}, run_blocks).image;
  const Tensor normed = norm_out_->forward(x, silu_temb);
  if (trace) trace->norm_out = normed;
  return proj_out_(normed);
}

std::string flux2_first_block_cache_refusal() {
  return "First Block Cache does not run on FLUX.2: diffusers 0.42.1 has no working First Block Cache for "
         "FLUX.2 (its single-stream blocks return the text and image tokens as one tensor, which its cache's "
         "last-block hook cannot take apart), so there is no reference to match. MagCache "
         "(magcache:calibrate, "
         "then magcache:THRESHOLD:ratios=...), TaylorSeer (taylorseer), Pyramid Attention Broadcast (pab) "
         "and "
         "FasterCache (fastercache) run on FLUX.2";
}

std::unique_ptr<Flux2Transformer2DModel> load_flux2_transformer(const std::string& folder, DType dtype,
                                                                const nn::TensorParallel& tp) {
  auto model = std::make_unique<Flux2Transformer2DModel>(Flux2TransformerConfig::from_file(folder), tp);
  nn::LoadOptions options;
  options.dtype = dtype;
  model->load_weights(nn::CheckpointWeights(folder), options);
  return model;
}

namespace {

// Appends (t, row, col, l) rows for a grid, row-major, to `ids`.
void append_grid_ids(std::vector<float>& ids, int64_t rows, int64_t cols, float t, const char* what) {
  KILN_CHECK(rows > 0 && cols > 0, what << ": expected a positive grid size, got " << rows << " x " << cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      ids.insert(ids.end(), {t, static_cast<float>(r), static_cast<float>(col), 0.0f});
    }
  }
}

}  // namespace

Tensor flux2_latent_ids(int64_t grid_height, int64_t grid_width) {
  std::vector<float> ids;
  append_grid_ids(ids, grid_height, grid_width, 0.0f, "flux2_latent_ids");
  return Tensor::from_vector(ids, {grid_height * grid_width, 4});
}

Tensor flux2_text_ids(int64_t length) {
  KILN_CHECK(length >= 0, "flux2_text_ids: expected a non-negative length, got " << length);
  std::vector<float> ids(static_cast<size_t>(length * 4), 0.0f);
  for (int64_t l = 0; l < length; ++l) ids[static_cast<size_t>(l * 4 + 3)] = static_cast<float>(l);
  return Tensor::from_vector(ids, {length, 4});
}

Tensor flux2_image_ids(const std::vector<std::pair<int64_t, int64_t>>& grids) {
  KILN_CHECK(!grids.empty(), "flux2_image_ids: expected at least one reference image");
  std::vector<float> ids;
  int64_t rows = 0;
  for (size_t i = 0; i < grids.size(); ++i) {
    const auto t = static_cast<float>(kReferenceTimeScale + kReferenceTimeScale * static_cast<int64_t>(i));
    append_grid_ids(ids, grids[i].first, grids[i].second, t, "flux2_image_ids");
    rows += grids[i].first * grids[i].second;
  }
  return Tensor::from_vector(ids, {rows, 4});
}

}  // namespace kiln::models
