#include "families/stable_diffusion/unet_blocks.h"

#include <string>

#include "kiln/ops/attention.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"

namespace kiln::models {

namespace {

constexpr double kTransformerNormEps = 1e-6;  // Transformer2DModel's GroupNorm
constexpr double kBlockNormEps = 1e-5;        // BasicTransformerBlock's LayerNorms
constexpr int64_t kFeedForwardMult = 4;

std::string index(const char* list, size_t i) {
  return std::string(list) + "." + std::to_string(i);
}

}  // namespace

UNetResnetBlock::UNetResnetBlock(int64_t in, int64_t out, int64_t temb, int64_t groups, double eps)
    : norm1_(groups, in, eps),
      norm2_(groups, out, eps),
      conv1_(in, out, 3, 1, 1),
      conv2_(out, out, 3, 1, 1),
      time_emb_proj_(temb, out) {
  register_module("norm1", &norm1_);
  register_module("conv1", &conv1_);
  register_module("time_emb_proj", &time_emb_proj_);
  register_module("norm2", &norm2_);
  register_module("conv2", &conv2_);
  if (in != out) {
    conv_shortcut_ = std::make_unique<nn::Conv2d>(in, out, 1);
    register_module("conv_shortcut", conv_shortcut_.get());
  }
}

Tensor UNetResnetBlock::forward(const Tensor& x, const Tensor& temb_act) const {
  if (!is_compiled()) return forward_eager(x, temb_act);
  return call_compiled(
      {x, temb_act}, [this](const auto& in) { return std::vector<Tensor>{forward_eager(in[0], in[1])}; })[0];
}

Tensor UNetResnetBlock::forward_eager(const Tensor& x, const Tensor& temb_act) const {
  Tensor h = conv1_(silu(norm1_(x)));
  const Tensor t = time_emb_proj_(temb_act);
  h = add(h, t.view({t.size(0), t.size(1), 1, 1}));
  h = conv2_(silu(norm2_(h)));
  return add(conv_shortcut_ ? (*conv_shortcut_)(x) : x, h);
}

UNetAttention::UNetAttention(int64_t dim, int64_t context_dim, int64_t heads, const nn::TensorParallel& tp)
    : heads_(tp.split(heads, "UNet2DConditionModel attention heads at " + std::to_string(dim) + " channels")),
      head_dim_(dim / heads),
      to_q_(dim, dim, false, nn::column(tp)),
      to_k_(context_dim, dim, false, nn::column(tp)),
      to_v_(context_dim, dim, false, nn::column(tp)),
      to_out_(dim, dim, true, nn::row(tp)) {
  register_module("to_q", &to_q_);
  register_module("to_k", &to_k_);
  register_module("to_v", &to_v_);
  register_module("to_out.0", &to_out_);
}

Tensor UNetAttention::forward(const Tensor& x, const Tensor& context) const {
  // This rank's heads (all of them without tensor parallelism) and their width.
  const int64_t batch = x.size(0), head = head_dim_, dim = heads_ * head;
  // [B, S, H, D] projections read as [B, H, S, D] in place; the output comes back [B, S, H, D]-ordered.
  const auto heads = [&](const Tensor& t) {
    return t.view({batch, t.size(1), heads_, head}).transpose(1, 2);
  };
  const Tensor out =
      scaled_dot_product_attention(heads(to_q_(x)), heads(to_k_(context)), heads(to_v_(context)));
  return to_out_(out.transpose(1, 2).reshape({batch, x.size(1), dim}));
}

UNetTransformerBlock::UNetTransformerBlock(int64_t dim, int64_t heads, int64_t context_dim,
                                           const nn::TensorParallel& tp)
    : norm1_(dim, kBlockNormEps),
      norm2_(dim, kBlockNormEps),
      norm3_(dim, kBlockNormEps),
      attn1_(dim, dim, heads, tp),
      attn2_(dim, context_dim, heads, tp),
      // GEGLU's projection writes [value | gate]: each half split on its own, so a rank's value and gate
      // columns pair up.
      ff_in_(dim, 2 * kFeedForwardMult * dim, true,
             nn::column(tp, {kFeedForwardMult * dim, kFeedForwardMult * dim})),
      ff_out_(kFeedForwardMult * dim, dim, true, nn::row(tp)) {
  register_module("norm1", &norm1_);
  register_module("attn1", &attn1_);
  register_module("norm2", &norm2_);
  register_module("attn2", &attn2_);
  register_module("norm3", &norm3_);
  register_module("ff.net.0.proj", &ff_in_);
  register_module("ff.net.2", &ff_out_);
}

Tensor UNetTransformerBlock::forward(const Tensor& x, const Tensor& context) const {
  if (!is_compiled()) return forward_eager(x, context);
  return call_compiled(
      {x, context}, [this](const auto& in) { return std::vector<Tensor>{forward_eager(in[0], in[1])}; })[0];
}

Tensor UNetTransformerBlock::forward_eager(const Tensor& x, const Tensor& context) const {
  const Tensor n1 = norm1_(x);
  Tensor h = add(attn1_.forward(n1, n1), x);
  h = add(attn2_.forward(norm2_(h), context), h);
  // GEGLU: the projection's first half times gelu(second half).
  const Tensor projected = ff_in_(norm3_(h));
  const int64_t inner = projected.size(-1) / 2;
  const std::vector<Tensor> halves = split(projected, {inner, inner}, -1);
  return add(ff_out_(mul(halves[0], gelu(halves[1]))), h);
}

UNetSpatialTransformer::UNetSpatialTransformer(int64_t channels, int64_t heads, int64_t layers,
                                               int64_t context_dim, int64_t groups, bool linear_projection,
                                               const nn::TensorParallel& tp)
    : norm_(groups, channels, kTransformerNormEps),
      proj_in_(channels, channels),
      proj_out_(channels, channels) {
  // Without use_linear_projection, proj_in and proj_out are 1x1 convolutions: the same product on the tokens,
  // with the weight stored [out, in, 1, 1] (and LoRA pairs for them in that shape too).
  if (!linear_projection) {
    proj_in_.store_weight_as_pointwise_conv();
    proj_out_.store_weight_as_pointwise_conv();
  }
  register_module("norm", &norm_);
  register_module("proj_in", &proj_in_);
  for (int64_t i = 0; i < layers; ++i) {
    blocks_.push_back(std::make_unique<UNetTransformerBlock>(channels, heads, context_dim, tp));
    register_module(index("transformer_blocks", static_cast<size_t>(i)), blocks_.back().get());
  }
  register_module("proj_out", &proj_out_);
}

Tensor UNetSpatialTransformer::forward(const Tensor& x, const Tensor& context) const {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const auto to_tokens = [&](const Tensor& t) { return t.permute({0, 2, 3, 1}).reshape({b, h * w, c}); };
  const auto to_map = [&](const Tensor& t) { return t.reshape({b, h, w, c}).permute({0, 3, 1, 2}); };
  Tensor tokens = proj_in_(to_tokens(norm_(x)));
  for (const auto& block : blocks_) tokens = block->forward(tokens, context);
  return add(to_map(proj_out_(tokens)), x);
}

UNetDownBlock::UNetDownBlock(const UNetBlockShape& s, int64_t in, int64_t out, int64_t layers, int64_t heads,
                             int64_t transformer_layers, bool downsample, int64_t padding) {
  for (int64_t j = 0; j < layers; ++j) {
    resnets_.push_back(std::make_unique<UNetResnetBlock>(j == 0 ? in : out, out, s.temb, s.groups, s.eps));
    register_module(index("resnets", static_cast<size_t>(j)), resnets_.back().get());
    if (heads > 0) {
      attentions_.push_back(std::make_unique<UNetSpatialTransformer>(
          out, heads, transformer_layers, s.context, s.groups, s.linear_projection, s.tp));
      register_module(index("attentions", static_cast<size_t>(j)), attentions_.back().get());
    }
  }
  if (downsample) {
    downsample_ = std::make_unique<nn::Conv2d>(out, out, 3, 2, padding);
    register_module("downsamplers.0.conv", downsample_.get());
  }
}

Tensor UNetDownBlock::forward(Tensor x, const Tensor& temb_act, const Tensor& context,
                              std::vector<Tensor>& skips) const {
  for (size_t j = 0; j < resnets_.size(); ++j) {
    x = resnets_[j]->forward(x, temb_act);
    if (!attentions_.empty()) x = attentions_[j]->forward(x, context);
    skips.push_back(x);
  }
  if (downsample_) {
    x = (*downsample_)(x);
    skips.push_back(x);
  }
  return x;
}

namespace {

void collect_levels(const std::vector<std::unique_ptr<UNetResnetBlock>>& resnets,
                    const std::vector<std::unique_ptr<UNetSpatialTransformer>>& attentions,
                    std::vector<nn::Module*>& resnet_out, std::vector<nn::Module*>& block_out) {
  for (size_t j = 0; j < resnets.size(); ++j) {
    resnet_out.push_back(resnets[j].get());
    if (!attentions.empty())
      for (const auto& block : attentions[j]->blocks()) block_out.push_back(block.get());
  }
}

}  // namespace

void UNetDownBlock::collect(std::vector<nn::Module*>& resnets,
                            std::vector<nn::Module*>& transformer_blocks) const {
  collect_levels(resnets_, attentions_, resnets, transformer_blocks);
}

void UNetUpBlock::collect(std::vector<nn::Module*>& resnets,
                          std::vector<nn::Module*>& transformer_blocks) const {
  collect_levels(resnets_, attentions_, resnets, transformer_blocks);
}

void UNetMidBlock::collect(std::vector<nn::Module*>& resnets,
                           std::vector<nn::Module*>& transformer_blocks) const {
  resnets.push_back(const_cast<UNetResnetBlock*>(&resnet0_));
  for (const auto& block : attention_.blocks()) transformer_blocks.push_back(block.get());
  resnets.push_back(const_cast<UNetResnetBlock*>(&resnet1_));
}

UNetMidBlock::UNetMidBlock(const UNetBlockShape& s, int64_t channels, int64_t heads,
                           int64_t transformer_layers)
    : resnet0_(channels, channels, s.temb, s.groups, s.eps),
      resnet1_(channels, channels, s.temb, s.groups, s.eps),
      attention_(channels, heads, transformer_layers, s.context, s.groups, s.linear_projection, s.tp) {
  register_module("resnets.0", &resnet0_);
  register_module("attentions.0", &attention_);
  register_module("resnets.1", &resnet1_);
}

Tensor UNetMidBlock::forward(const Tensor& x, const Tensor& temb_act, const Tensor& context) const {
  return resnet1_.forward(attention_.forward(resnet0_.forward(x, temb_act), context), temb_act);
}

UNetUpBlock::UNetUpBlock(const UNetBlockShape& s, int64_t in, int64_t prev_out, int64_t out, int64_t layers,
                         int64_t heads, int64_t transformer_layers, bool upsample) {
  for (int64_t j = 0; j < layers; ++j) {
    // The last resnet's skip is the level's input width (the down block's first input); the others' are
    // this level's own width.
    const int64_t skip = j == layers - 1 ? in : out;
    const int64_t running = j == 0 ? prev_out : out;
    resnets_.push_back(std::make_unique<UNetResnetBlock>(running + skip, out, s.temb, s.groups, s.eps));
    register_module(index("resnets", static_cast<size_t>(j)), resnets_.back().get());
    if (heads > 0) {
      attentions_.push_back(std::make_unique<UNetSpatialTransformer>(
          out, heads, transformer_layers, s.context, s.groups, s.linear_projection, s.tp));
      register_module(index("attentions", static_cast<size_t>(j)), attentions_.back().get());
    }
  }
  if (upsample) {
    upsample_ = std::make_unique<nn::Conv2d>(out, out, 3, 1, 1);
    register_module("upsamplers.0.conv", upsample_.get());
  }
}

Tensor UNetUpBlock::forward(Tensor x, const Tensor& temb_act, const Tensor& context,
                            std::vector<Tensor>& skips) const {
  for (size_t j = 0; j < resnets_.size(); ++j) {
    x = concat({x, skips.back()}, 1);
    skips.pop_back();
    x = resnets_[j]->forward(x, temb_act);
    if (!attentions_.empty()) x = attentions_[j]->forward(x, context);
  }
  if (upsample_) {
    // Nearest upsampling to the next skip's size: 2x, or one less where the down path halved an odd size.
    const int64_t h = skips.empty() ? 2 * x.size(2) : skips.back().size(2);
    const int64_t w = skips.empty() ? 2 * x.size(3) : skips.back().size(3);
    x = (*upsample_)(upsample_nearest2d(x, h, w));
  }
  return x;
}

}  // namespace kiln::models
