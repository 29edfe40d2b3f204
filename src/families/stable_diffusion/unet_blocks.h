// The blocks of UNet2DConditionModel under diffusers' names: ResnetBlock2D, the spatial transformer
// (Transformer2DModel with BasicTransformerBlocks), the down, middle and up blocks that hold them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/nn/layers.h"
#include "kiln/nn/module.h"
#include "kiln/nn/tensor_parallel.h"

namespace kiln::models {

// ResnetBlock2D: norm1 -> SiLU -> conv1, + time_emb_proj(SiLU(temb)) per channel, norm2 -> SiLU -> conv2,
// added to the input (through a 1x1 conv_shortcut when the width changes).
class UNetResnetBlock : public nn::Module {
 public:
  UNetResnetBlock(int64_t in, int64_t out, int64_t temb, int64_t groups, double eps);
  // x [B, in, h, w], temb_act = SiLU(temb) [B, temb] -> [B, out, h, w]. Compiled (a repeated block of the
  // UNet) it runs as one program per shape.
  Tensor forward(const Tensor& x, const Tensor& temb_act) const;
  bool supports_compile() const override { return true; }

 private:
  Tensor forward_eager(const Tensor& x, const Tensor& temb_act) const;

  nn::GroupNorm norm1_, norm2_;
  nn::Conv2d conv1_, conv2_;
  nn::Linear time_emb_proj_;
  std::unique_ptr<nn::Conv2d> conv_shortcut_;
};

// Attention (attn1: self, attn2: cross) with diffusers' projections: to_q/to_k/to_v without bias, to_out.0
// with one; heads of width dim / heads, scale 1/sqrt(head width). Under tensor parallelism each rank holds
// heads / size of the heads (to_q/to_k/to_v split by rows, to_out by columns, its partial outputs summed).
class UNetAttention : public nn::Module {
 public:
  UNetAttention(int64_t dim, int64_t context_dim, int64_t heads, const nn::TensorParallel& tp);
  // x [B, S, dim], context [B, L, context_dim] (x itself for self-attention) -> [B, S, dim].
  Tensor forward(const Tensor& x, const Tensor& context) const;

 private:
  int64_t heads_;     // this rank's
  int64_t head_dim_;  // dim / heads
  nn::Linear to_q_, to_k_, to_v_, to_out_;
};

// BasicTransformerBlock (norm_type "layer_norm"): x + attn1(norm1(x)), + attn2(norm2(x), prompt),
// + ff(norm3(x)) with GEGLU (proj to 2 * 4 * dim, hidden * gelu(gate), back to dim). Under tensor parallelism
// the attentions split their heads and the feed-forward its inner width (each rank the same slice of the
// value and gate halves); the norms run whole on every rank.
class UNetTransformerBlock : public nn::Module {
 public:
  UNetTransformerBlock(int64_t dim, int64_t heads, int64_t context_dim, const nn::TensorParallel& tp);
  Tensor forward(const Tensor& x, const Tensor& context) const;
  bool supports_compile() const override { return true; }

 private:
  Tensor forward_eager(const Tensor& x, const Tensor& context) const;

  nn::LayerNorm norm1_, norm2_, norm3_;
  UNetAttention attn1_, attn2_;
  nn::Linear ff_in_, ff_out_;
};

// Transformer2DModel over a feature map: GroupNorm (eps 1e-6), proj_in on the tokens (a 1x1 conv, stored so,
// or a Linear with use_linear_projection: the same product), the blocks over the h*w tokens, proj_out, added
// to the input. Its blocks split under `tp`; the GroupNorm and the projections run whole on every rank.
class UNetSpatialTransformer : public nn::Module {
 public:
  UNetSpatialTransformer(int64_t channels, int64_t heads, int64_t layers, int64_t context_dim, int64_t groups,
                         bool linear_projection, const nn::TensorParallel& tp);
  Tensor forward(const Tensor& x, const Tensor& context) const;
  const std::vector<std::unique_ptr<UNetTransformerBlock>>& blocks() const { return blocks_; }

 private:
  nn::GroupNorm norm_;
  nn::Linear proj_in_, proj_out_;
  std::vector<std::unique_ptr<UNetTransformerBlock>> blocks_;
};

// What the blocks share: the width of the time embedding, the prompt's, the GroupNorm settings, and the
// tensor-parallel group their transformer blocks split over (the ResNets and samplers stay whole).
struct UNetBlockShape {
  int64_t temb = 0;
  int64_t context = 0;
  int64_t groups = 32;
  double eps = 1e-5;
  bool linear_projection = false;
  nn::TensorParallel tp;
};

// One level of the down path (DownBlock2D, or CrossAttnDownBlock2D when heads > 0): resnets (each followed by
// its transformer), then a stride-2 conv unless it is the last level. Every layer's output is a skip.
class UNetDownBlock : public nn::Module {
 public:
  UNetDownBlock(const UNetBlockShape& s, int64_t in, int64_t out, int64_t layers, int64_t heads,
                int64_t transformer_layers, bool downsample, int64_t padding);
  Tensor forward(Tensor x, const Tensor& temb_act, const Tensor& context, std::vector<Tensor>& skips) const;
  // Its ResNet blocks and transformer blocks, in the order they run.
  void collect(std::vector<nn::Module*>& resnets, std::vector<nn::Module*>& transformer_blocks) const;

 private:
  std::vector<std::unique_ptr<UNetResnetBlock>> resnets_;
  std::vector<std::unique_ptr<UNetSpatialTransformer>> attentions_;
  std::unique_ptr<nn::Conv2d> downsample_;
};

// UNetMidBlock2DCrossAttn: resnet, transformer, resnet.
class UNetMidBlock : public nn::Module {
 public:
  UNetMidBlock(const UNetBlockShape& s, int64_t channels, int64_t heads, int64_t transformer_layers);
  Tensor forward(const Tensor& x, const Tensor& temb_act, const Tensor& context) const;
  void collect(std::vector<nn::Module*>& resnets, std::vector<nn::Module*>& transformer_blocks) const;

 private:
  UNetResnetBlock resnet0_, resnet1_;
  UNetSpatialTransformer attention_;
};

// One level of the up path (UpBlock2D, or CrossAttnUpBlock2D when heads > 0): each resnet takes the running
// features concatenated with the last remaining skip; then nearest 2x upsampling (to the size of the next
// skip, diffusers' upsample_size) and a 3x3 conv unless it is the last level.
class UNetUpBlock : public nn::Module {
 public:
  UNetUpBlock(const UNetBlockShape& s, int64_t in, int64_t prev_out, int64_t out, int64_t layers,
              int64_t heads, int64_t transformer_layers, bool upsample);
  // Consumes `skips` from the back, one per resnet.
  Tensor forward(Tensor x, const Tensor& temb_act, const Tensor& context, std::vector<Tensor>& skips) const;
  size_t layers() const { return resnets_.size(); }
  void collect(std::vector<nn::Module*>& resnets, std::vector<nn::Module*>& transformer_blocks) const;

 private:
  std::vector<std::unique_ptr<UNetResnetBlock>> resnets_;
  std::vector<std::unique_ptr<UNetSpatialTransformer>> attentions_;
  std::unique_ptr<nn::Conv2d> upsample_;
};

}  // namespace kiln::models
