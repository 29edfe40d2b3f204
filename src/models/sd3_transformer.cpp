#include "kiln/models/sd3_transformer.h"

#include <set>
#include <tuple>

#include "kiln/models/sd3_single_file.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/nn/weight_file.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "models/dit_layers.h"
#include "models/flux_embeddings.h"
#include "models/sd3_blocks.h"

namespace kiln::models {

namespace {

std::string describe(const Tensor& t) {
  return t.defined() ? t.str() : std::string("undefined");
}

}  // namespace

SD3Transformer2DModel::SD3Transformer2DModel(const SD3TransformerConfig& config, const nn::TensorParallel& tp)
    : config_((config.validate("SD3Transformer2DModel config"), config)),
      pos_embed_proj_(config.in_channels, config.inner_dim(), config.patch_size, config.patch_size),
      context_embedder_(config.joint_attention_dim, config.caption_projection_dim, true,
                        nn::column_gathered(tp)),
      proj_out_(config.inner_dim(), config.patch_size * config.patch_size * config.out_channels, true,
                nn::column_gathered(tp)) {
  // Checked first, so that the error names the head count rather than a width it implies.
  tp.split(config.num_attention_heads, "SD3Transformer2DModel num_attention_heads");
  const int64_t dim = config.inner_dim();
  register_module("pos_embed.proj", &pos_embed_proj_);
  register_parameter("pos_embed.pos_embed", &pos_embed_table_,
                     {1, config.pos_embed_max_size * config.pos_embed_max_size, dim});
  // CombinedTimestepTextProjEmbeddings: FLUX's time/text embedding without the guidance branch.
  time_text_embed_ = std::make_unique<FluxTimeTextEmbedding>(dim, config.pooled_projection_dim, false, tp);
  register_module("time_text_embed", time_text_embed_.get());
  register_module("context_embedder", &context_embedder_);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    transformer_blocks_.push_back(std::make_unique<SD3JointTransformerBlock>(
        dim, config.num_attention_heads, config.attention_head_dim, !config.qk_norm.empty(),
        config.is_dual_attention_layer(i), /*context_pre_only=*/i == config.num_layers - 1, tp));
    register_module("transformer_blocks." + std::to_string(i), transformer_blocks_.back().get());
  }
  norm_out_ = std::make_unique<AdaLayerNormContinuous>(dim, /*bias=*/true, tp);
  register_module("norm_out", norm_out_.get());
  register_module("proj_out", &proj_out_);
}

SD3Transformer2DModel::~SD3Transformer2DModel() = default;

DType SD3Transformer2DModel::dtype() const {
  KILN_CHECK(context_embedder_.weight.defined(),
             "SD3Transformer2DModel: the weights are not loaded (call load_weights first)");
  return context_embedder_.dtype();
}

Tensor SD3Transformer2DModel::patch_embed(const Tensor& hidden) const {
  const int64_t p = config_.patch_size, max = config_.pos_embed_max_size;
  const int64_t h = hidden.size(2) / p, w = hidden.size(3) / p, dim = config_.inner_dim();
  const Tensor patches = pos_embed_proj_(hidden);  // [B, dim, h, w]
  // PatchEmbed.cropped_pos_embed: the centre h x w window of the stored max x max table (not recomputed).
  const int64_t top = (max - h) / 2, left = (max - w) / 2;
  const Tensor pos =
      pos_embed_table_.view({max, max, dim}).narrow(0, top, h).narrow(1, left, w).reshape({1, h * w, dim});
  // (latent.flatten(2).transpose(1, 2) + pos_embed).to(latent.dtype)
  return add(patches.flatten(2).transpose(1, 2), pos).to(patches.dtype());
}

Tensor SD3Transformer2DModel::forward(const Tensor& hidden, const Tensor& encoder_hidden,
                                      const Tensor& pooled, const Tensor& timestep,
                                      const std::vector<int64_t>& skip_layers) const {
  std::vector<Tensor> inputs{hidden, encoder_hidden, pooled, timestep};
  for (Tensor& t : inputs) t = on_weights_device(t);
  if (!is_compiled()) return forward_eager(inputs[0], inputs[1], inputs[2], inputs[3], skip_layers);
  // The skipped blocks change the graph: they are part of the compiled program's key.
  return call_compiled(
      inputs,
      [&](const auto& in) {
        return std::vector<Tensor>{forward_eager(in[0], in[1], in[2], in[3], skip_layers)};
      },
      "skip_layers=" + shape_str(skip_layers))[0];
}

std::vector<nn::BlockList> SD3Transformer2DModel::repeated_blocks() const {
  // diffusers has no repeated-block list for SD3. The joint blocks are one list all the same: under
  // compile_repeated_blocks they share one cache whose programs are keyed by each block's parameter shapes
  // and flags, so each distinct structure (MMDiT-X dual-attention blocks, plain blocks, the context_pre_only
  // last block) compiles once and its instances share it.
  return {nn::block_list("transformer_blocks", transformer_blocks_)};
}

Tensor SD3Transformer2DModel::forward_eager(const Tensor& hidden, const Tensor& encoder_hidden,
                                            const Tensor& pooled, const Tensor& timestep,
                                            const std::vector<int64_t>& skip_layers) const {
  const SD3TransformerConfig& c = config_;
  const char* op = "SD3Transformer2DModel";
  const DType dt = dtype();
  const int64_t p = c.patch_size;
  KILN_CHECK(hidden.defined() && hidden.dim() == 4 && hidden.size(1) == c.in_channels && hidden.size(2) > 0 &&
                 hidden.size(3) > 0 && hidden.size(2) % p == 0 && hidden.size(3) % p == 0,
             op << ": expected hidden_states [B, " << c.in_channels << ", H, W] with H and W multiples of "
                << p << ", got " << describe(hidden));
  const int64_t batch = hidden.size(0), h = hidden.size(2) / p, w = hidden.size(3) / p;
  KILN_CHECK(h <= c.pos_embed_max_size && w <= c.pos_embed_max_size,
             op << ": the latents are " << h << " x " << w
                << " patches but the position table covers at most " << c.pos_embed_max_size << " x "
                << c.pos_embed_max_size << " (pos_embed_max_size)");
  KILN_CHECK(hidden.dtype() == dt, op << ": hidden_states is " << dtype_name(hidden.dtype())
                                      << " but the weights are " << dtype_name(dt)
                                      << "; the model computes in its weights' dtype");
  KILN_CHECK(encoder_hidden.defined() && encoder_hidden.dim() == 3 && encoder_hidden.size(0) == batch &&
                 encoder_hidden.size(2) == c.joint_attention_dim && encoder_hidden.dtype() == dt,
             op << ": expected encoder_hidden_states [" << batch << ", L, " << c.joint_attention_dim << "] "
                << dtype_name(dt) << ", got " << describe(encoder_hidden));
  KILN_CHECK(pooled.defined() && pooled.dim() == 2 && pooled.size(0) == batch &&
                 pooled.size(1) == c.pooled_projection_dim && pooled.dtype() == dt,
             op << ": expected pooled_projections [" << batch << ", " << c.pooled_projection_dim << "] "
                << dtype_name(dt) << ", got " << describe(pooled));
  KILN_CHECK(
      timestep.defined() && timestep.dim() == 1 && timestep.size(0) == batch && is_floating(timestep.dtype()),
      op << ": expected a floating timestep [" << batch << "], got " << describe(timestep));
  for (int64_t i : skip_layers)
    KILN_CHECK(i >= 0 && i < c.num_layers,
               op << ": skip_layers holds " << i << ", outside the model's blocks 0.." << c.num_layers - 1);
  const std::set<int64_t> skip(skip_layers.begin(), skip_layers.end());

  Tensor x = patch_embed(hidden);
  const Tensor temb = time_text_embed_->forward(timestep, Tensor(), pooled);
  Tensor ctx = context_embedder_(encoder_hidden);
  const Tensor silu_temb = silu(temb);
  for (size_t i = 0; i < transformer_blocks_.size(); ++i) {
    if (skip.count(static_cast<int64_t>(i))) continue;  // skip-layer guidance: the block is the identity
    std::tie(x, ctx) = transformer_blocks_[i]->forward(x, ctx, silu_temb);
  }
  x = proj_out_(norm_out_->forward(x, silu_temb));  // [B, h * w, p * p * out]
  // Unpatchify: "nhwpqc -> nchpwq".
  return x.view({batch, h, w, p, p, c.out_channels})
      .permute({0, 5, 1, 3, 2, 4})
      .reshape({batch, c.out_channels, h * p, w * p});
}

std::unique_ptr<SD3Transformer2DModel> load_sd3_transformer(const std::string& folder, DType dtype,
                                                            const nn::TensorParallel& tp) {
  auto model = std::make_unique<SD3Transformer2DModel>(SD3TransformerConfig::from_file(folder), tp);
  nn::LoadOptions options;
  options.dtype = dtype;
  model->load_weights(nn::CheckpointWeights(folder), options);
  return model;
}

std::unique_ptr<SD3Transformer2DModel> SD3Transformer2DModel::from_single_file(const std::string& path,
                                                                               const std::string& config,
                                                                               DType dtype) {
  std::shared_ptr<const nn::WeightSource> file = nn::open_weight_file(path);
  auto model = std::make_unique<SD3Transformer2DModel>(SD3TransformerConfig::from_file(config));
  nn::LoadOptions options;
  options.dtype = dtype;
  model->load_weights(*sd3_single_file_weights(file, model->config()), options);
  return model;
}

}  // namespace kiln::models
