#include "families/qwen_image/qwen_image_vae_layers.h"

#include <cmath>
#include <string>

#include "kiln/ops.h"
#include "kiln/ops/attention.h"

namespace kiln::models::qwen_image_vae {

CausalConv3d::CausalConv3d(int64_t in, int64_t out, int64_t kernel) : kernel_(kernel) {
  register_parameter("weight", &weight, {out, in, kernel, kernel, kernel});
  register_parameter("bias", &bias, {out});
}

Tensor CausalConv3d::forward(const Tensor& x) const {
  const int64_t pad = kernel_ / 2;
  return conv2d(x, weight.select(2, kernel_ - 1), bias, {1, 1}, {pad, pad});
}

TimeConv::TimeConv(int64_t in, int64_t out) {
  register_parameter("weight", &weight, {out, in, 3, 1, 1});
  register_parameter("bias", &bias, {out});
}

RmsNorm::RmsNorm(int64_t dim, bool image_gamma) : dim_(dim) {
  register_parameter("gamma", &gamma, image_gamma ? Shape{dim, 1, 1} : Shape{dim, 1, 1, 1});
}

Tensor RmsNorm::forward(const Tensor& x) const {
  const Tensor xf = x.to(float32);
  const Tensor length = clamp(sqrt(sum(square(xf), {1}, true)), 1e-12, std::nullopt);
  const Tensor normalized = div(xf, length).to(x.dtype());
  return mul(mul(normalized, std::sqrt(static_cast<double>(dim_))), gamma.view({1, dim_, 1, 1}));
}

ResidualBlock::ResidualBlock(int64_t in, int64_t out)
    : norm1(in, false), norm2(out, false), conv1(in, out, 3), conv2(out, out, 3) {
  register_module("norm1", &norm1);
  register_module("conv1", &conv1);
  register_module("norm2", &norm2);
  register_module("conv2", &conv2);
  if (in != out) {
    conv_shortcut = std::make_unique<CausalConv3d>(in, out, 1);
    register_module("conv_shortcut", conv_shortcut.get());
  }
}

Tensor ResidualBlock::forward(Tensor x) const {
  const Tensor shortcut = conv_shortcut ? conv_shortcut->forward(x) : x;
  Tensor h = silu(norm1.forward(x));
  x = Tensor();
  h = conv1.forward(h);
  h = conv2.forward(silu(norm2.forward(h)));
  return add(h, shortcut);
}

AttentionBlock::AttentionBlock(int64_t dim) : norm(dim, true), to_qkv(dim, 3 * dim, 1), proj(dim, dim, 1) {
  register_module("norm", &norm);
  register_module("to_qkv", &to_qkv);
  register_module("proj", &proj);
}

Tensor AttentionBlock::forward(const Tensor& x) const {
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  // [B, 3C, H, W] -> [B, HW, 3C]: q, k and v are the thirds of each position's channels, one head of width C.
  const Tensor qkv = to_qkv(norm.forward(x)).view({B, 3 * C, H * W}).transpose(1, 2);
  const auto parts = chunk(qkv, 3, 2);
  const Tensor attended =
      scaled_dot_product_attention(parts[0].unsqueeze(1), parts[1].unsqueeze(1), parts[2].unsqueeze(1));
  const Tensor image = attended.squeeze(1).transpose(1, 2).reshape({B, C, H, W});
  return add(proj(image), x);
}

Resample::Resample(int64_t dim, bool upsample, bool temporal)
    : conv(dim, upsample ? dim / 2 : dim, 3, upsample ? 1 : 2, upsample ? 1 : 0), upsample_(upsample) {
  register_module("resample.1", &conv);
  if (temporal) {
    time_conv = std::make_unique<TimeConv>(dim, upsample ? 2 * dim : dim);
    register_module("time_conv", time_conv.get());
  }
}

Tensor Resample::forward(Tensor x) const {
  if (upsample_) return conv(upsample_nearest2d(x, 2));  // nearest-exact at 2x is nearest
  // nn.ZeroPad2d((0, 1, 0, 1)): one zero column on the right and one zero row at the bottom.
  Tensor padded = Tensor::zeros({x.size(0), x.size(1), x.size(2) + 1, x.size(3) + 1}, x.dtype(), x.device());
  padded.narrow(2, 0, x.size(2)).narrow(3, 0, x.size(3)).copy_(x);
  x = Tensor();
  return conv(padded);
}

MidBlock::MidBlock(int64_t dim) : resnet0(dim, dim), resnet1(dim, dim), attention(dim) {
  register_module("resnets.0", &resnet0);
  register_module("attentions.0", &attention);
  register_module("resnets.1", &resnet1);
}

Tensor MidBlock::forward(Tensor x) const {
  x = resnet0.forward(std::move(x));
  x = attention.forward(x);
  return resnet1.forward(std::move(x));
}

Encoder::Encoder(const AutoencoderKLQwenImageConfig& c) : conv_in(c.input_channels, c.base_dim, 3) {
  register_module("conv_in", &conv_in);
  int64_t out = c.base_dim;
  const size_t levels = c.dim_mult.size();
  for (size_t i = 0; i < levels; ++i) {
    int64_t in = out;
    out = c.base_dim * c.dim_mult[i];
    for (int64_t j = 0; j < c.num_res_blocks; ++j, in = out)
      down_blocks.push_back(std::make_unique<ResidualBlock>(in, out));
    if (i + 1 < levels)
      down_blocks.push_back(std::make_unique<Resample>(out, false, c.temperal_downsample[i]));
  }
  for (size_t k = 0; k < down_blocks.size(); ++k)
    register_module("down_blocks." + std::to_string(k), down_blocks[k].get());
  mid_block = std::make_unique<MidBlock>(out);
  norm_out = std::make_unique<RmsNorm>(out, false);
  conv_out = std::make_unique<CausalConv3d>(out, 2 * c.z_dim, 3);
  register_module("mid_block", mid_block.get());
  register_module("norm_out", norm_out.get());
  register_module("conv_out", conv_out.get());
}

Tensor Encoder::forward(Tensor x) const {
  x = conv_in.forward(x);
  for (const auto& layer : down_blocks) x = layer->forward(std::move(x));
  x = mid_block->forward(std::move(x));
  return conv_out->forward(silu(norm_out->forward(x)));
}

UpBlock::UpBlock(int64_t in, int64_t out, int64_t num_res_blocks, bool upsample, bool temporal) {
  for (int64_t j = 0; j <= num_res_blocks; ++j) {
    resnets.push_back(std::make_unique<ResidualBlock>(j == 0 ? in : out, out));
    register_module("resnets." + std::to_string(j), resnets.back().get());
  }
  if (upsample) {
    upsampler = std::make_unique<Resample>(out, true, temporal);
    register_module("upsamplers.0", upsampler.get());
  }
}

Tensor UpBlock::forward(Tensor x) const {
  for (const auto& r : resnets) x = r->forward(std::move(x));
  return upsampler ? upsampler->forward(std::move(x)) : x;
}

Decoder::Decoder(const AutoencoderKLQwenImageConfig& c) {
  // diffusers' widths: the deepest level's, then every level's from the deepest up; each upsampler halves its
  // level's width, which is what the next level takes in.
  const size_t levels = c.dim_mult.size();
  std::vector<int64_t> dims{c.base_dim * c.dim_mult.back()};
  for (size_t i = levels; i-- > 0;) dims.push_back(c.base_dim * c.dim_mult[i]);
  conv_in = std::make_unique<CausalConv3d>(c.z_dim, dims[0], 3);
  mid_block = std::make_unique<MidBlock>(dims[0]);
  register_module("conv_in", conv_in.get());
  register_module("mid_block", mid_block.get());
  for (size_t i = 0; i < levels; ++i) {
    const int64_t in = i > 0 ? dims[i] / 2 : dims[i];
    const bool upsample = i + 1 < levels;
    // temperal_upsample = temperal_downsample reversed.
    const bool temporal = upsample && c.temperal_downsample[levels - 2 - i];
    up_blocks.push_back(std::make_unique<UpBlock>(in, dims[i + 1], c.num_res_blocks, upsample, temporal));
    register_module("up_blocks." + std::to_string(i), up_blocks.back().get());
  }
  norm_out = std::make_unique<RmsNorm>(dims.back(), false);
  conv_out = std::make_unique<CausalConv3d>(dims.back(), c.input_channels, 3);
  register_module("norm_out", norm_out.get());
  register_module("conv_out", conv_out.get());
}

Tensor Decoder::forward(Tensor x) const {
  x = conv_in->forward(x);
  x = mid_block->forward(std::move(x));
  for (const auto& block : up_blocks) x = block->forward(std::move(x));
  return conv_out->forward(silu(norm_out->forward(x)));
}

}  // namespace kiln::models::qwen_image_vae

namespace kiln::models {

AutoencoderKLQwenImage::Layers::Layers(const AutoencoderKLQwenImageConfig& c)
    : encoder(c), quant_conv(2 * c.z_dim, 2 * c.z_dim, 1), post_quant_conv(c.z_dim, c.z_dim, 1), decoder(c) {}

}  // namespace kiln::models
