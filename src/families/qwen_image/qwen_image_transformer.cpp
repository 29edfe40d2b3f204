#include "kiln/families/qwen_image/qwen_image_transformer.h"

#include <algorithm>
#include <tuple>

#include "families/qwen_image/qwen_image_blocks.h"
#include "families/qwen_image/qwen_image_rope.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "models/dit_layers.h"

namespace kiln::models {

namespace {

constexpr double kRopeTheta = 10000.0;  // QwenEmbedRope(theta=10000): not a config key
constexpr double kNormEps = 1e-6;       // txt_norm and norm_out

std::string describe(const Tensor& t) {
  return t.defined() ? t.str() : std::string("undefined");
}

}  // namespace

QwenImageTransformer2DModel::QwenImageTransformer2DModel(const QwenImageTransformerConfig& config,
                                                         const nn::TensorParallel& tp)
    // The heads are what tensor parallelism splits: a degree that does not divide them is refused by name
    // first.
    : config_((config.validate("QwenImageTransformer2DModel config"),
               tp.split(config.num_attention_heads, "QwenImageTransformer2DModel num_attention_heads"),
               config)),
      txt_norm_(config.joint_attention_dim, kNormEps),
      img_in_(config.in_channels, config.inner_dim(), true, nn::column_gathered(tp)),
      txt_in_(config.joint_attention_dim, config.inner_dim(), true, nn::column_gathered(tp)),
      proj_out_(config.inner_dim(), config.patch_size * config.patch_size * config.out_channels, true,
                nn::column_gathered(tp)) {
  const int64_t dim = config.inner_dim();
  time_text_embed_ = std::make_unique<QwenTimestepEmbedding>(dim, tp);
  register_module("time_text_embed", time_text_embed_.get());
  register_module("txt_norm", &txt_norm_);
  register_module("img_in", &img_in_);
  register_module("txt_in", &txt_in_);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    transformer_blocks_.push_back(std::make_unique<QwenImageTransformerBlock>(dim, config.num_attention_heads,
                                                                              config.attention_head_dim, tp));
    register_module("transformer_blocks." + std::to_string(i), transformer_blocks_.back().get());
    transformer_blocks_.back()->use_step_cache(&step_cache_);  // TaylorSeer forecasts the attentions
  }
  norm_out_ = std::make_unique<AdaLayerNormContinuous>(dim, /*bias=*/true, tp, kNormEps);
  register_module("norm_out", norm_out_.get());
  register_module("proj_out", &proj_out_);
}

QwenImageTransformer2DModel::~QwenImageTransformer2DModel() = default;

std::vector<nn::BlockList> QwenImageTransformer2DModel::repeated_blocks() const {
  return {nn::block_list("transformer_blocks", transformer_blocks_)};
}

Tensor QwenImageTransformer2DModel::forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                                            const Tensor& encoder_mask, const Tensor& timestep,
                                            const std::vector<QwenImageShape>& img_shapes) const {
  const QwenImageTransformerConfig& c = config_;
  const char* op = "QwenImageTransformer2DModel";
  KILN_CHECK(img_in_.weight.defined(), op << ": the weights are not loaded (call load_weights first)");
  KILN_CHECK(
      hidden_states.defined() && hidden_states.dim() == 3 && hidden_states.size(2) == c.in_channels,
      op << ": expected hidden_states [B, L, " << c.in_channels << "], got " << describe(hidden_states));
  const int64_t batch = hidden_states.size(0), image = hidden_states.size(1);
  const DType dtype = img_in_.dtype();
  KILN_CHECK(hidden_states.dtype() == dtype, op << ": hidden_states is " << dtype_name(hidden_states.dtype())
                                                << " but the weights are " << dtype_name(dtype)
                                                << "; the model computes in its weights' dtype");
  KILN_CHECK(encoder_hidden_states.defined() && encoder_hidden_states.dim() == 3 &&
                 encoder_hidden_states.size(0) == batch &&
                 encoder_hidden_states.size(2) == c.joint_attention_dim &&
                 encoder_hidden_states.dtype() == dtype,
             op << ": expected encoder_hidden_states [" << batch << ", S, " << c.joint_attention_dim << "] "
                << dtype_name(dtype) << ", got " << describe(encoder_hidden_states));
  const int64_t text = encoder_hidden_states.size(1);
  KILN_CHECK(!encoder_mask.defined() || (encoder_mask.dim() == 2 && encoder_mask.size(0) == batch &&
                                         encoder_mask.size(1) == text && !is_floating(encoder_mask.dtype())),
             op << ": expected encoder_hidden_states_mask [" << batch << ", " << text
                << "] of integers (1: a prompt token, 0: padding) or none, got " << describe(encoder_mask));
  KILN_CHECK(
      timestep.defined() && timestep.dim() == 1 && timestep.size(0) == batch && is_floating(timestep.dtype()),
      op << ": expected a floating timestep [" << batch << "], got " << describe(timestep));
  int64_t tokens = 0;
  for (const QwenImageShape& s : img_shapes) {
    KILN_CHECK(s.frames > 0 && s.height > 0 && s.width > 0,
               op << ": img_shapes entries must be positive (frames, height, width) in patches, got ("
                  << s.frames << ", " << s.height << ", " << s.width << ")");
    tokens += s.frames * s.height * s.width;
  }
  KILN_CHECK(tokens == image, op << ": hidden_states has " << image << " tokens but img_shapes describe "
                                 << tokens << " (the sum of frames * height * width over "
                                 << img_shapes.size() << " grids); they must agree");

  // The tables and the mask are built here, outside a compiled program, and enter it as inputs: two grids of
  // the same token count have different tables.
  const QwenRopeTables rope = qwen_image_rope(img_shapes, text, c.axes_dims_rope, kRopeTheta);
  Tensor mask;
  if (encoder_mask.defined()) {
    // Every image token is a valid key; no query is masked (diffusers' [B, 1, 1, S + L] bool mask).
    const Tensor text_kept = ne(on_weights_device(encoder_mask), 0.0);
    const Tensor image_kept = Tensor::full({batch, image}, 1.0, boolean, text_kept.device());
    mask = concat({text_kept, image_kept}, 1).view({batch, 1, 1, text + image});
  }
  // zero_cond_t: which image tokens follow the first grid (the input images, modulated by t = 0), [1, L, 1].
  Tensor reference;
  if (c.zero_cond_t) {
    const QwenImageShape& noise = img_shapes.front();
    std::vector<float> kept(static_cast<size_t>(image), 1.0f);
    std::fill_n(kept.begin(), noise.frames * noise.height * noise.width, 0.0f);
    reference = ne(Tensor::from_vector(kept, {1, image, 1}), 0.0);
  }
  std::vector<Tensor> inputs{hidden_states, encoder_hidden_states, timestep, rope.cos, rope.sin, mask,
                             reference};
  for (Tensor& t : inputs)
    if (t.defined()) t = on_weights_device(t);
  std::erase_if(inputs, [](const Tensor& t) { return !t.defined(); });
  const bool masked = mask.defined(), zero_cond = reference.defined();
  const auto eager = [this, masked, zero_cond](const std::vector<Tensor>& in) {
    return forward_eager(in[0], in[1], masked ? in[5] : Tensor(), in[2], in[3], in[4],
                         zero_cond ? in[masked ? 6 : 5] : Tensor());
  };
  // A step cache decides between the blocks, on the host: the whole forward cannot be one program then.
  if (!is_compiled() || step_cache_.active()) return eager(inputs);
  return call_compiled(
      inputs, [&](const auto& in) { return std::vector<Tensor>{eager(in)}; },
      std::string(masked ? "masked" : "") + (zero_cond ? "zero_cond" : ""))[0];
}

Tensor QwenImageTransformer2DModel::forward_eager(const Tensor& hidden_states,
                                                  const Tensor& encoder_hidden_states, const Tensor& mask,
                                                  const Tensor& timestep, const Tensor& rope_cos,
                                                  const Tensor& rope_sin, const Tensor& reference) const {
  const DType dtype = img_in_.dtype();
  const int64_t batch = hidden_states.size(0);
  Tensor x = img_in_(hidden_states);
  // diffusers: timestep.to(hidden_states.dtype); the scale by 1000 comes inside the sinusoid. zero_cond_t
  // embeds [t, 0 * t] (2B rows); the text and norm_out take the first B.
  Tensor t = timestep.to(dtype);
  if (reference.defined()) t = concat({t, mul(t, 0.0)}, 0);
  const Tensor silu_temb = silu(time_text_embed_->forward(t));
  Tensor ctx = txt_in_(txt_norm_(encoder_hidden_states));
  const auto run_blocks = [&](size_t first, size_t last, const nn::BlockStreams& in) {
    Tensor xi = in.image, ci = in.text;
    for (size_t i = first; i < last; ++i)
      std::tie(xi, ci) =
          transformer_blocks_[i]->forward(xi, ci, silu_temb, rope_cos, rope_sin, mask, reference);
    return nn::BlockStreams{xi, ci};
  };
  x = step_cache_.run(transformer_blocks_.size(), {x, ctx}, run_blocks).image;
  return proj_out_(norm_out_->forward(x, silu_temb.narrow(0, 0, batch)));
}

std::unique_ptr<QwenImageTransformer2DModel> load_qwen_image_transformer(const std::string& folder,
                                                                         DType dtype,
                                                                         const nn::TensorParallel& tp) {
  auto model =
      std::make_unique<QwenImageTransformer2DModel>(QwenImageTransformerConfig::from_file(folder), tp);
  nn::LoadOptions options;
  options.dtype = dtype;
  model->load_weights(nn::CheckpointWeights(folder), options);
  return model;
}

}  // namespace kiln::models
