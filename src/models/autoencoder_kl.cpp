#include "kiln/models/autoencoder_kl.h"

#include "kiln/io/json_config.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/ops.h"
#include "kiln/ops/attention.h"

namespace kiln::models {

namespace {
constexpr double kEps = 1e-6;  // every GroupNorm of diffusers' Encoder/Decoder

void check_block_types(const io::JsonConfig& f, const char* key, const char* expected) {
  for (const auto& t : f.get_or<std::vector<std::string>>(key, {}))
    KILN_CHECK(t == expected,
               f.where(key) << ": block type '" << t << "' is not supported (expected " << expected << ")");
}
}  // namespace

AutoencoderKLConfig AutoencoderKLConfig::from_file(const std::string& path) {
  const auto f = io::JsonConfig::load(path);
  AutoencoderKLConfig c;
  c.in_channels = f.get_or<int64_t>("in_channels", 3);
  c.out_channels = f.get_or<int64_t>("out_channels", 3);
  c.latent_channels = f.get_or<int64_t>("latent_channels", 4);
  c.block_out_channels = f.get_or<std::vector<int64_t>>("block_out_channels", {64});
  c.layers_per_block = f.get_or<int64_t>("layers_per_block", 1);
  c.norm_num_groups = f.get_or<int64_t>("norm_num_groups", 32);
  c.mid_block_add_attention = f.get_or<bool>("mid_block_add_attention", true);
  c.use_quant_conv = f.get_or<bool>("use_quant_conv", true);
  c.use_post_quant_conv = f.get_or<bool>("use_post_quant_conv", true);
  c.scaling_factor = f.get_or<double>("scaling_factor", 0.18215);
  c.shift_factor = f.get_or<double>("shift_factor", 0.0);
  KILN_CHECK(!c.block_out_channels.empty(), path << ": block_out_channels is empty");
  KILN_CHECK(f.get_or<std::string>("act_fn", "silu") == "silu", path << ": act_fn must be silu");
  check_block_types(f, "down_block_types", "DownEncoderBlock2D");
  check_block_types(f, "up_block_types", "UpDecoderBlock2D");
  for (int64_t ch : c.block_out_channels)
    KILN_CHECK(ch % c.norm_num_groups == 0, path << ": block_out_channels entry " << ch
                                                 << " is not divisible by norm_num_groups "
                                                 << c.norm_num_groups);
  return c;
}

AutoencoderKL::ResnetBlock::ResnetBlock(int64_t in, int64_t out, int64_t groups)
    : norm1(groups, in, kEps), norm2(groups, out, kEps), conv1(in, out, 3, 1, 1), conv2(out, out, 3, 1, 1) {
  register_module("norm1", &norm1);
  register_module("conv1", &conv1);
  register_module("norm2", &norm2);
  register_module("conv2", &conv2);
  if (in != out) {
    conv_shortcut.emplace(in, out, 1);
    register_module("conv_shortcut", &*conv_shortcut);
  }
}

Tensor AutoencoderKL::ResnetBlock::forward(const Tensor& x) const {
  Tensor h = conv1(silu(norm1(x)));
  h = conv2(silu(norm2(h)));
  return add(conv_shortcut ? (*conv_shortcut)(x) : x, h);
}

AutoencoderKL::MidAttention::MidAttention(int64_t channels, int64_t groups)
    : group_norm(groups, channels, kEps),
      to_q(channels, channels),
      to_k(channels, channels),
      to_v(channels, channels),
      to_out(channels, channels) {
  register_module("group_norm", &group_norm);
  register_module("to_q", &to_q);
  register_module("to_k", &to_k);
  register_module("to_v", &to_v);
  register_module("to_out.0", &to_out);
}

Tensor AutoencoderKL::MidAttention::forward(const Tensor& x) const {
  // One head over all h*w positions, width = channels, with a residual connection.
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const Tensor tokens = group_norm(x).view({B, C, H * W}).transpose(1, 2);        // [B, HW, C]
  auto head = [&](const nn::Linear& proj) { return proj(tokens).unsqueeze(1); };  // [B, 1, HW, C]
  const Tensor attn = scaled_dot_product_attention(head(to_q), head(to_k), head(to_v)).squeeze(1);
  const Tensor out = to_out(attn).transpose(1, 2).reshape({B, C, H, W});
  return add(out, x);
}

AutoencoderKL::MidBlock::MidBlock(int64_t channels, int64_t groups, bool with_attention)
    : resnet0(channels, channels, groups), resnet1(channels, channels, groups) {
  register_module("resnets.0", &resnet0);
  if (with_attention) {
    attention.emplace(channels, groups);
    register_module("attentions.0", &*attention);
  }
  register_module("resnets.1", &resnet1);
}

Tensor AutoencoderKL::MidBlock::forward(const Tensor& x) const {
  Tensor h = resnet0.forward(x);
  if (attention) h = attention->forward(h);
  return resnet1.forward(h);
}

AutoencoderKL::AutoencoderKL(const AutoencoderKLConfig& c)
    : config_(c),
      enc_conv_in_(c.in_channels, c.block_out_channels.front(), 3, 1, 1),
      enc_mid_(c.block_out_channels.back(), c.norm_num_groups, c.mid_block_add_attention),
      enc_norm_out_(c.norm_num_groups, c.block_out_channels.back(), kEps),
      enc_conv_out_(c.block_out_channels.back(), 2 * c.latent_channels, 3, 1, 1),
      dec_conv_in_(c.latent_channels, c.block_out_channels.back(), 3, 1, 1),
      dec_mid_(c.block_out_channels.back(), c.norm_num_groups, c.mid_block_add_attention),
      dec_norm_out_(c.norm_num_groups, c.block_out_channels.front(), kEps),
      dec_conv_out_(c.block_out_channels.front(), c.out_channels, 3, 1, 1) {
  const auto& ch = c.block_out_channels;
  const size_t n = ch.size();
  register_module("encoder.conv_in", &enc_conv_in_);
  int64_t out = ch[0];
  for (size_t i = 0; i < n; ++i) {
    const int64_t in = out;
    out = ch[i];
    auto stage = std::make_unique<Stage>();
    const std::string prefix = "encoder.down_blocks." + std::to_string(i);
    for (int64_t j = 0; j < c.layers_per_block; ++j) {
      stage->resnets.push_back(std::make_unique<ResnetBlock>(j == 0 ? in : out, out, c.norm_num_groups));
      register_module(prefix + ".resnets." + std::to_string(j), stage->resnets.back().get());
    }
    if (i + 1 < n) {
      stage->resample.emplace(out, out, 3, 2, 0);
      register_module(prefix + ".downsamplers.0.conv", &*stage->resample);
    }
    down_.push_back(std::move(stage));
  }
  register_module("encoder.mid_block", &enc_mid_);
  register_module("encoder.conv_norm_out", &enc_norm_out_);
  register_module("encoder.conv_out", &enc_conv_out_);
  if (c.use_quant_conv) {
    quant_conv_.emplace(2 * c.latent_channels, 2 * c.latent_channels, 1);
    register_module("quant_conv", &*quant_conv_);
  }
  if (c.use_post_quant_conv) {
    post_quant_conv_.emplace(c.latent_channels, c.latent_channels, 1);
    register_module("post_quant_conv", &*post_quant_conv_);
  }
  register_module("decoder.conv_in", &dec_conv_in_);
  register_module("decoder.mid_block", &dec_mid_);
  out = ch[n - 1];
  for (size_t i = 0; i < n; ++i) {
    const int64_t in = out;
    out = ch[n - 1 - i];
    auto stage = std::make_unique<Stage>();
    const std::string prefix = "decoder.up_blocks." + std::to_string(i);
    for (int64_t j = 0; j <= c.layers_per_block; ++j) {
      stage->resnets.push_back(std::make_unique<ResnetBlock>(j == 0 ? in : out, out, c.norm_num_groups));
      register_module(prefix + ".resnets." + std::to_string(j), stage->resnets.back().get());
    }
    if (i + 1 < n) {
      stage->resample.emplace(out, out, 3, 1, 1);
      register_module(prefix + ".upsamplers.0.conv", &*stage->resample);
    }
    up_.push_back(std::move(stage));
  }
  register_module("decoder.conv_norm_out", &dec_norm_out_);
  register_module("decoder.conv_out", &dec_conv_out_);
}

Tensor AutoencoderKL::decode(const Tensor& z) const {
  KILN_CHECK(z.dim() == 4 && z.size(1) == config_.latent_channels,
             "AutoencoderKL.decode: expected latents [B, " << config_.latent_channels << ", h, w], got "
                                                           << shape_str(z.shape()));
  Tensor x = post_quant_conv_ ? (*post_quant_conv_)(z) : z;
  x = dec_conv_in_(x);
  x = dec_mid_.forward(x);
  for (const auto& stage : up_) {
    for (const auto& r : stage->resnets) x = r->forward(x);
    if (stage->resample) x = (*stage->resample)(upsample_nearest2d(x, 2));
  }
  return dec_conv_out_(silu(dec_norm_out_(x)));
}

AutoencoderKL::LatentDistribution AutoencoderKL::encode(const Tensor& image) const {
  KILN_CHECK(image.dim() == 4 && image.size(1) == config_.in_channels,
             "AutoencoderKL.encode: expected images [B, " << config_.in_channels << ", H, W], got "
                                                          << shape_str(image.shape()));
  const int64_t f = config_.scale_factor();
  KILN_CHECK(image.size(2) % f == 0 && image.size(3) % f == 0, "AutoencoderKL.encode: image size "
                                                                   << image.size(2) << "x" << image.size(3)
                                                                   << " is not a multiple of " << f);
  Tensor x = enc_conv_in_(image);
  for (const auto& stage : down_) {
    for (const auto& r : stage->resnets) x = r->forward(x);
    if (stage->resample) {
      // diffusers' Downsample2D pads one zero row and column at the bottom/right, then convolves with
      // stride 2.
      Tensor padded =
          Tensor::zeros({x.size(0), x.size(1), x.size(2) + 1, x.size(3) + 1}, x.dtype(), x.device());
      padded.narrow(2, 0, x.size(2)).narrow(3, 0, x.size(3)).copy_(x);
      x = (*stage->resample)(padded);
    }
  }
  x = enc_mid_.forward(x);
  x = enc_conv_out_(silu(enc_norm_out_(x)));
  if (quant_conv_) x = (*quant_conv_)(x);
  const auto halves = chunk(x, 2, 1);
  // diffusers clamps the log-variance to [-30, 20] before use.
  return {halves[0], clamp(halves[1], -30.0, 20.0)};
}

std::unique_ptr<AutoencoderKL> load_autoencoder_kl(const std::string& folder, DType dtype) {
  auto model = std::make_unique<AutoencoderKL>(AutoencoderKLConfig::from_file(folder + "/config.json"));
  nn::CheckpointWeights weights(folder);
  nn::LoadOptions options;
  options.dtype = dtype;
  model->load_weights(weights, options);
  return model;
}

}  // namespace kiln::models
