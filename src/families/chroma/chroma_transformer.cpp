#include "kiln/families/chroma/chroma_transformer.h"

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <variant>

#include "families/chroma/chroma_blocks.h"
#include "families/chroma/chroma_single_file.h"
#include "kiln/models/flux_transformer.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/nn/weight_file.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"

namespace kiln::models {

namespace {

constexpr double kRopeTheta = 10000.0;   // FluxPosEmbed's, as FLUX.1
constexpr double kSingleMlpRatio = 4.0;  // ChromaSingleTransformerBlock's mlp_ratio

std::string describe(const Tensor& t) {
  return t.defined() ? t.str() : std::string("undefined");
}

}  // namespace

ChromaTransformer2DModel::ChromaTransformer2DModel(const ChromaTransformerConfig& config,
                                                   const nn::TensorParallel& tp)
    : config_((config.validate("ChromaTransformer2DModel config"), config)),
      context_embedder_(config.joint_attention_dim, config.inner_dim(), true, nn::column_gathered(tp)),
      x_embedder_(config.in_channels, config.inner_dim(), true, nn::column_gathered(tp)),
      proj_out_(config.inner_dim(), config.patch_size * config.patch_size * config.out_channels, true,
                nn::column_gathered(tp)) {
  const int64_t dim = config.inner_dim();
  distilled_guidance_layer_ = std::make_unique<ChromaApproximator>(
      config.approximator_num_channels, dim, config.approximator_hidden_dim, config.approximator_layers, tp);
  // time_text_embed holds one non-persistent buffer (the modulation indices' sinusoids): nothing to load.
  register_module("distilled_guidance_layer", distilled_guidance_layer_.get());
  register_module("context_embedder", &context_embedder_);
  register_module("x_embedder", &x_embedder_);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    transformer_blocks_.push_back(std::make_unique<ChromaTransformerBlock>(dim, config.num_attention_heads,
                                                                           config.attention_head_dim, tp));
    register_module("transformer_blocks." + std::to_string(i), transformer_blocks_.back().get());
    transformer_blocks_.back()->use_step_cache(&step_cache_);  // the attention caches act on the attentions
  }
  const auto mlp_hidden = static_cast<int64_t>(static_cast<double>(dim) * kSingleMlpRatio);
  for (int64_t i = 0; i < config.num_single_layers; ++i) {
    single_transformer_blocks_.push_back(std::make_unique<ChromaSingleTransformerBlock>(
        dim, config.num_attention_heads, config.attention_head_dim, mlp_hidden, tp));
    register_module("single_transformer_blocks." + std::to_string(i),
                    single_transformer_blocks_.back().get());
    single_transformer_blocks_.back()->use_step_cache(&step_cache_);
  }
  register_module("proj_out", &proj_out_);
  step_cache_.set_refusal([](const StepCacheConfig& cache) {
    return std::holds_alternative<FirstBlockCacheConfig>(cache) ||
                   std::holds_alternative<MagCacheConfig>(cache)
               ? chroma_block_cache_refusal(cache)
               : std::string();
  });
}

ChromaTransformer2DModel::~ChromaTransformer2DModel() = default;

std::vector<nn::BlockList> ChromaTransformer2DModel::repeated_blocks() const {
  return {nn::block_list("transformer_blocks", transformer_blocks_),
          nn::block_list("single_transformer_blocks", single_transformer_blocks_)};
}

Tensor ChromaTransformer2DModel::approximator_input(const Tensor& timestep) const {
  // diffusers: timestep.to(hidden_states.dtype) * 1000, rounded to that dtype.
  const Tensor t = mul(on_weights_device(timestep).to(x_embedder_.dtype()), 1000.0);
  return chroma_approximator_input(t, config_.approximator_num_channels, config_.modulation_rows());
}

Tensor ChromaTransformer2DModel::modulations(const Tensor& timestep) const {
  return distilled_guidance_layer_->forward(approximator_input(timestep));
}

Tensor ChromaTransformer2DModel::forward(const Tensor& hidden, const Tensor& encoder_hidden,
                                         const Tensor& timestep, const Tensor& txt_ids, const Tensor& img_ids,
                                         const Tensor& attention_mask) const {
  std::vector<Tensor> inputs{hidden, encoder_hidden, timestep, txt_ids, img_ids};
  if (attention_mask.defined()) inputs.push_back(attention_mask);
  for (Tensor& t : inputs) t = on_weights_device(t);
  const auto eager = [this](const std::vector<Tensor>& in) {
    return forward_eager(in[0], in[1], in[2], in[3], in[4], in.size() > 5 ? in[5] : Tensor());
  };
  // A step cache decides inside the blocks, on the host: the whole forward cannot be one program then (the
  // pipeline refuses a cache in compile mode).
  if (!is_compiled() || step_cache_.active()) return eager(inputs);
  return call_compiled(
      inputs, [&](const auto& in) { return std::vector<Tensor>{eager(in)}; },
      attention_mask.defined() ? "masked" : "")[0];
}

Tensor ChromaTransformer2DModel::forward_eager(const Tensor& hidden, const Tensor& encoder_hidden,
                                               const Tensor& timestep, const Tensor& txt_ids,
                                               const Tensor& img_ids, const Tensor& attention_mask) const {
  const ChromaTransformerConfig& c = config_;
  const char* op = "ChromaTransformer2DModel";
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
  const auto axes = static_cast<int64_t>(c.axes_dims_rope.size());
  KILN_CHECK(txt_ids.defined() && txt_ids.dim() == 2 && txt_ids.size(0) == text && txt_ids.size(1) == axes,
             op << ": expected txt_ids [" << text << ", " << axes << "], got " << describe(txt_ids));
  KILN_CHECK(img_ids.defined() && img_ids.dim() == 2 && img_ids.size(0) == image && img_ids.size(1) == axes,
             op << ": expected img_ids [" << image << ", " << axes << "], got " << describe(img_ids));
  KILN_CHECK(!attention_mask.defined() || (attention_mask.dim() == 2 && attention_mask.size(0) == batch &&
                                           attention_mask.size(1) == text + image),
             op << ": expected an attention_mask [" << batch << ", " << text + image
                << "] (the text's tokens, then the image's), got " << describe(attention_mask));

  Tensor x = x_embedder_(hidden);
  // Every block's modulation at once: [B, M, D].
  const Tensor mods = modulations(timestep);
  Tensor ctx = context_embedder_(encoder_hidden);
  const FluxRopeTables rope = flux_rope_tables(concat({txt_ids, img_ids}, 0), c.axes_dims_rope, kRopeTheta);
  // diffusers forms mask[:, None, None, :] * mask[:, None, :, None] in the mask's dtype and hands it to SDPA,
  // which adds a floating mask to the scores.
  Tensor bias;
  if (attention_mask.defined()) {
    const Tensor m = attention_mask.to(dtype);
    bias = mul(m.unsqueeze(1), m.unsqueeze(2)).unsqueeze(1);
  }

  const int64_t singles = c.num_single_layers, doubles = c.num_layers;
  // Rows: single block k at 3k; double block k's image stream at 3 Ns + 6k, its text stream 6 Nd further.
  const auto rows = [&](int64_t first, int64_t count) { return mods.narrow(1, first, count).contiguous(); };
  // Blocks [first, last) of the double-stream blocks followed by the single-stream ones, as the step cache
  // asks for them (the attention caches: all at once, each evaluation recorded); the single-stream blocks see
  // [text; image], concatenated once as diffusers does.
  const auto run_blocks = [&](size_t first, size_t last, const nn::BlockStreams& in) {
    Tensor xs = in.image, cs = in.text;
    const auto d = static_cast<size_t>(doubles);
    for (size_t i = first; i < std::min(last, d); ++i) {
      const auto k = static_cast<int64_t>(i);
      std::tie(xs, cs) = transformer_blocks_[i]->forward(
          xs, cs, rows(3 * singles + 6 * k, 6), rows(3 * singles + 6 * doubles + 6 * k, 6), rope, bias);
    }
    if (last <= d) return nn::BlockStreams{xs, cs};
    Tensor joint = concat({cs, xs}, 1);
    for (size_t i = std::max(first, d); i < last; ++i)
      joint = single_transformer_blocks_[i - d]->forward(joint, rows(3 * static_cast<int64_t>(i - d), 3),
                                                         rope, bias);
    return nn::BlockStreams{joint.narrow(1, text, image), joint.narrow(1, 0, text)};
  };
  x = step_cache_.run(static_cast<size_t>(doubles + singles), {x, ctx}, run_blocks).image;
  // The final norm's rows: shift, then scale (not AdaLayerNormContinuous' order).
  const int64_t last = c.modulation_rows();
  return proj_out_(modulate(layer_norm_plain(x), mods.select(1, last - 1), mods.select(1, last - 2)));
}

std::string chroma_block_cache_refusal(const StepCacheConfig& cache) {
  const char* name = std::holds_alternative<FirstBlockCacheConfig>(cache) ? "First Block Cache" : "MagCache";
  return std::string(name) +
         " does not run on Chroma: diffusers 0.42.1 cannot run it there (Chroma's transformer blocks are not "
         "in its hook registry, TransformerBlockRegistry, so enable_cache fails with \"not registered\"), so "
         "there is no reference to match. TaylorSeer (taylorseer), Pyramid Attention Broadcast (pab) and "
         "FasterCache (fastercache) run on Chroma";
}

std::unique_ptr<ChromaTransformer2DModel> load_chroma_transformer(const std::string& folder, DType dtype,
                                                                  const nn::TensorParallel& tp) {
  auto model = std::make_unique<ChromaTransformer2DModel>(ChromaTransformerConfig::from_file(folder), tp);
  nn::LoadOptions options;
  options.dtype = dtype;
  model->load_weights(nn::CheckpointWeights(folder), options);
  return model;
}

std::unique_ptr<ChromaTransformer2DModel> ChromaTransformer2DModel::from_single_file(
    const std::string& path, const SingleFileOptions& options) {
  std::shared_ptr<const nn::WeightSource> file = nn::open_weight_file(path);
  const ChromaTransformerConfig config = options.config.empty()
                                             ? infer_chroma_config(*file)
                                             : ChromaTransformerConfig::from_file(options.config);
  auto model = std::make_unique<ChromaTransformer2DModel>(config);
  nn::LoadOptions load;
  load.dtype = options.dtype;
  model->load_weights(*chroma_single_file_weights(file, config), load);
  return model;
}

}  // namespace kiln::models
