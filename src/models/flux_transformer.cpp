#include "kiln/models/flux_transformer.h"

#include <algorithm>
#include <tuple>

#include "kiln/models/flux_single_file.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/nn/weight_file.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "models/flux_blocks.h"
#include "models/flux_embeddings.h"

namespace kiln::models {

namespace {

// FluxPosEmbed(theta=10000, ...): diffusers hard-codes theta; it is not a config key.
constexpr double kRopeTheta = 10000.0;
// FluxSingleTransformerBlock's mlp_ratio (not a config key either).
constexpr double kSingleMlpRatio = 4.0;

std::string describe(const Tensor& t) {
  return t.defined() ? t.str() : std::string("undefined");
}

}  // namespace

FluxTransformer2DModel::FluxTransformer2DModel(const FluxTransformerConfig& config,
                                               const nn::TensorParallel& tp)
    : config_((config.validate("FluxTransformer2DModel config"), config)),
      context_embedder_(config.joint_attention_dim, config.inner_dim(), true, nn::column_gathered(tp)),
      x_embedder_(config.in_channels, config.inner_dim(), true, nn::column_gathered(tp)),
      proj_out_(config.inner_dim(), config.patch_size * config.patch_size * config.out_channels, true,
                nn::column_gathered(tp)) {
  const int64_t dim = config.inner_dim();
  time_text_embed_ =
      std::make_unique<FluxTimeTextEmbedding>(dim, config.pooled_projection_dim, config.guidance_embeds, tp);
  register_module("time_text_embed", time_text_embed_.get());
  register_module("context_embedder", &context_embedder_);
  register_module("x_embedder", &x_embedder_);
  step_cache_.set_published_mag_ratios(flux_mag_ratios());  // MagCache's default: FLUX.1-dev's
  for (int64_t i = 0; i < config.num_layers; ++i) {
    transformer_blocks_.push_back(std::make_unique<FluxTransformerBlock>(dim, config.num_attention_heads,
                                                                         config.attention_head_dim, tp));
    register_module("transformer_blocks." + std::to_string(i), transformer_blocks_.back().get());
    transformer_blocks_.back()->use_step_cache(&step_cache_);  // TaylorSeer forecasts the attentions
  }
  const auto mlp_hidden = static_cast<int64_t>(static_cast<double>(dim) * kSingleMlpRatio);
  for (int64_t i = 0; i < config.num_single_layers; ++i) {
    single_transformer_blocks_.push_back(std::make_unique<FluxSingleTransformerBlock>(
        dim, config.num_attention_heads, config.attention_head_dim, mlp_hidden, tp));
    register_module("single_transformer_blocks." + std::to_string(i),
                    single_transformer_blocks_.back().get());
    single_transformer_blocks_.back()->use_step_cache(&step_cache_);
  }
  norm_out_ = std::make_unique<AdaLayerNormContinuous>(dim, /*bias=*/true, tp);
  register_module("norm_out", norm_out_.get());
  register_module("proj_out", &proj_out_);
}

FluxTransformer2DModel::~FluxTransformer2DModel() = default;

Tensor FluxTransformer2DModel::forward(const Tensor& hidden, const Tensor& encoder_hidden,
                                       const Tensor& pooled, const Tensor& timestep, const Tensor& guidance,
                                       const Tensor& txt_ids, const Tensor& img_ids) const {
  std::vector<Tensor> inputs{hidden, encoder_hidden, pooled, timestep, guidance, txt_ids, img_ids};
  for (Tensor& t : inputs) t = on_weights_device(t);
  // A step cache decides between the blocks, on the host: the whole forward cannot be one program then (the
  // pipelines refuse a cache in compile mode; compile-blocks compiles the blocks and leaves it the decision).
  if (!is_compiled() || step_cache_.active())
    return forward_eager(inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], inputs[5], inputs[6]);
  return call_compiled(inputs, [this](const auto& in) {
    return std::vector<Tensor>{forward_eager(in[0], in[1], in[2], in[3], in[4], in[5], in[6])};
  })[0];
}

std::vector<nn::BlockList> FluxTransformer2DModel::repeated_blocks() const {
  return {nn::block_list("transformer_blocks", transformer_blocks_),
          nn::block_list("single_transformer_blocks", single_transformer_blocks_)};
}

Tensor FluxTransformer2DModel::forward_eager(const Tensor& hidden, const Tensor& encoder_hidden,
                                             const Tensor& pooled, const Tensor& timestep,
                                             const Tensor& guidance, const Tensor& txt_ids,
                                             const Tensor& img_ids) const {
  const FluxTransformerConfig& c = config_;
  const char* op = "FluxTransformer2DModel";
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
  KILN_CHECK(pooled.defined() && pooled.dim() == 2 && pooled.size(0) == batch &&
                 pooled.size(1) == c.pooled_projection_dim && pooled.dtype() == dtype,
             op << ": expected pooled_projections [" << batch << ", " << c.pooled_projection_dim << "] "
                << dtype_name(dtype) << ", got " << describe(pooled));
  KILN_CHECK(
      timestep.defined() && timestep.dim() == 1 && timestep.size(0) == batch && is_floating(timestep.dtype()),
      op << ": expected a floating timestep [" << batch << "], got " << describe(timestep));
  if (c.guidance_embeds) {
    KILN_CHECK(
        guidance.defined() && guidance.dim() == 1 && guidance.size(0) == batch &&
            is_floating(guidance.dtype()),
        op << ": this model embeds the guidance scale (guidance_embeds = true, FLUX.1-dev); expected a "
              "floating guidance ["
           << batch << "], got " << describe(guidance));
  } else {
    KILN_CHECK(!guidance.defined(), op << ": this model has no guidance embedding (guidance_embeds = false, "
                                          "FLUX.1-schnell); pass an undefined guidance, got "
                                       << describe(guidance));
  }
  const auto axes = static_cast<int64_t>(c.axes_dims_rope.size());
  KILN_CHECK(txt_ids.defined() && txt_ids.dim() == 2 && txt_ids.size(0) == text && txt_ids.size(1) == axes,
             op << ": expected txt_ids [" << text << ", " << axes << "], got " << describe(txt_ids));
  KILN_CHECK(img_ids.defined() && img_ids.dim() == 2 && img_ids.size(0) == image && img_ids.size(1) == axes,
             op << ": expected img_ids [" << image << ", " << axes << "], got " << describe(img_ids));

  Tensor x = x_embedder_(hidden);
  // diffusers: timestep.to(hidden_states.dtype) * 1000 (likewise guidance), each step rounded to that dtype.
  const Tensor t = mul(timestep.to(dtype), 1000.0);
  const Tensor g = guidance.defined() ? mul(guidance.to(dtype), 1000.0) : Tensor();
  const Tensor temb = time_text_embed_->forward(t, g, pooled);
  Tensor ctx = context_embedder_(encoder_hidden);
  // ids = cat(txt_ids, img_ids) (promoting like torch.cat), read as float32.
  const FluxRopeTables rope = flux_rope_tables(concat({txt_ids, img_ids}, 0), c.axes_dims_rope, kRopeTheta);
  const Tensor silu_temb = silu(temb);

  // Blocks [first, last) of the double-stream blocks followed by the single-stream ones. The single-stream
  // blocks see [text; image]; diffusers concatenates and splits around every block, which moves the same
  // values, so the joint sequence is built once per run of them.
  const size_t doubles = transformer_blocks_.size();
  const auto run_blocks = [&](size_t first, size_t last, const nn::BlockStreams& in) {
    Tensor x = in.image, ctx = in.text;
    for (size_t i = first; i < std::min(last, doubles); ++i)
      std::tie(x, ctx) = transformer_blocks_[i]->forward(x, ctx, silu_temb, rope);
    if (last <= doubles) return nn::BlockStreams{x, ctx};
    Tensor joint = concat({ctx, x}, 1);
    for (size_t i = std::max(first, doubles); i < last; ++i)
      joint = single_transformer_blocks_[i - doubles]->forward(joint, silu_temb, rope);
    return nn::BlockStreams{joint.narrow(1, text, image), joint.narrow(1, 0, text)};
  };
  x = step_cache_.run(doubles + single_transformer_blocks_.size(), {x, ctx}, run_blocks).image;
  return proj_out_(norm_out_->forward(x, silu_temb));
}

std::unique_ptr<FluxTransformer2DModel> load_flux_transformer(const std::string& folder, DType dtype,
                                                              const nn::TensorParallel& tp) {
  auto model = std::make_unique<FluxTransformer2DModel>(FluxTransformerConfig::from_file(folder), tp);
  nn::LoadOptions options;
  options.dtype = dtype;
  model->load_weights(nn::CheckpointWeights(folder), options);
  return model;
}

std::unique_ptr<FluxTransformer2DModel> FluxTransformer2DModel::from_single_file(
    const std::string& path, const SingleFileOptions& options) {
  std::shared_ptr<const nn::WeightSource> file = nn::open_weight_file(path);
  const FluxTransformerConfig config =
      options.config.empty() ? infer_flux_config(*file) : FluxTransformerConfig::from_file(options.config);
  auto model = std::make_unique<FluxTransformer2DModel>(config);
  nn::LoadOptions load;
  load.dtype = options.dtype;
  model->load_weights(*flux_single_file_weights(file, config), load);
  return model;
}

Tensor flux_latent_image_ids(int64_t grid_height, int64_t grid_width, DType dtype) {
  KILN_CHECK(grid_height > 0 && grid_width > 0, "flux_latent_image_ids: expected a positive grid size, got "
                                                    << grid_height << " x " << grid_width);
  std::vector<float> ids(static_cast<size_t>(grid_height * grid_width * 3), 0.0f);
  for (int64_t r = 0; r < grid_height; ++r) {
    for (int64_t col = 0; col < grid_width; ++col) {
      const auto i = static_cast<size_t>((r * grid_width + col) * 3);
      ids[i + 1] = static_cast<float>(r);
      ids[i + 2] = static_cast<float>(col);
    }
  }
  // Built in float32 and cast, as the pipeline does (bfloat16 then rounds large coordinates the same way).
  return Tensor::from_vector(ids, {grid_height * grid_width, 3}).to(dtype);
}

Tensor flux_pack_latents(const Tensor& latents) {
  const int64_t b = latents.size(0), c = latents.size(1), h = latents.size(2), w = latents.size(3);
  // [B, C, h/2, 2, w/2, 2] -> [B, h/2, w/2, C, 2, 2] -> [B, (h/2)(w/2), 4C]
  return latents.view({b, c, h / 2, 2, w / 2, 2})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({b, (h / 2) * (w / 2), c * 4});
}

Tensor flux_unpack_latents(const Tensor& packed, int64_t h, int64_t w) {
  const int64_t b = packed.size(0), c = packed.size(2) / 4;
  return packed.view({b, h / 2, w / 2, c, 2, 2}).permute({0, 3, 1, 4, 2, 5}).reshape({b, c, h, w});
}

Tensor flux_text_ids(int64_t length, DType dtype) {
  KILN_CHECK(length >= 0, "flux_text_ids: expected a non-negative length, got " << length);
  return Tensor::zeros({length, 3}, dtype);
}

}  // namespace kiln::models
