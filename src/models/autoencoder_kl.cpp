#include "kiln/models/autoencoder_kl.h"

#include <algorithm>
#include <functional>

#include "kiln/core/limits.h"
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
  const std::string cls = f.get_or<std::string>("_class_name", "AutoencoderKL");
  KILN_CHECK(cls == "AutoencoderKL" || cls == "AutoencoderKLFlux2",
             f.where("_class_name") << " is '" << cls << "', expected AutoencoderKL or AutoencoderKLFlux2");
  c.flux2 = cls == "AutoencoderKLFlux2";
  if (c.flux2) {
    c.decoder_block_out_channels = f.get_or<std::vector<int64_t>>("decoder_block_out_channels", {});
    c.batch_norm_eps = f.get_or<double>("batch_norm_eps", 1e-4);
    c.patch_size = f.get_or<std::vector<int64_t>>("patch_size", {2, 2});
    KILN_CHECK(c.patch_size == (std::vector<int64_t>{2, 2}),
               f.where("patch_size") << ": only 2x2 patches are supported (what the FLUX.2 pipelines use)");
    KILN_CHECK(c.batch_norm_eps > 0 && c.batch_norm_eps < 1,
               f.where("batch_norm_eps") << ": expected a value in (0, 1), got " << c.batch_norm_eps);
  }
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
  // diffusers allows a [height, width] pair and tiles with its first entry.
  if (f.type_of("sample_size") == "array") {
    const auto sizes = f.get<std::vector<int64_t>>("sample_size");
    KILN_CHECK(!sizes.empty(), f.where("sample_size") << ": empty list");
    c.sample_size = sizes.front();
  } else {
    c.sample_size = f.get_or<int64_t>("sample_size", 32);
  }
  KILN_CHECK(!c.block_out_channels.empty(), path << ": block_out_channels is empty");
  using limits::kMaxLayers, limits::kMaxPositions, limits::kMaxStages, limits::kMaxWidth;
  limits::check_config(path, {{"in_channels", c.in_channels, kMaxWidth, 1},
                              {"out_channels", c.out_channels, kMaxWidth, 1},
                              {"latent_channels", c.latent_channels, kMaxWidth, 1},
                              {"the number of block_out_channels",
                               static_cast<int64_t>(c.block_out_channels.size()), kMaxStages, 1},
                              {"layers_per_block", c.layers_per_block, kMaxLayers, 1},
                              {"norm_num_groups", c.norm_num_groups, kMaxWidth, 1},
                              {"sample_size", c.sample_size, kMaxPositions, 1}});
  for (int64_t ch : c.block_out_channels)
    limits::check_config(path, {{"block_out_channels entry", ch, kMaxWidth, 1}});
  for (int64_t ch : c.decoder_block_out_channels)
    limits::check_config(path, {{"decoder_block_out_channels entry", ch, kMaxWidth, 1}});
  KILN_CHECK(f.get_or<std::string>("act_fn", "silu") == "silu", path << ": act_fn must be silu");
  check_block_types(f, "down_block_types", "DownEncoderBlock2D");
  check_block_types(f, "up_block_types", "UpDecoderBlock2D");
  KILN_CHECK(c.decoder_block_out_channels.empty() ||
                 c.decoder_block_out_channels.size() == c.block_out_channels.size(),
             path << ": decoder_block_out_channels has " << c.decoder_block_out_channels.size()
                  << " entries, block_out_channels " << c.block_out_channels.size());
  KILN_CHECK(c.norm_num_groups > 0, path << ": norm_num_groups must be positive, got " << c.norm_num_groups);
  for (const auto* list : {&c.block_out_channels, &c.decoder_block_out_channels})
    for (int64_t ch : *list)
      KILN_CHECK(ch > 0 && ch % c.norm_num_groups == 0,
                 path << ": block width " << ch << " is not a positive multiple of norm_num_groups "
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

namespace {

// conv(pre(x)) for a stride-1 convolution with "same" padding (3x3 pad 1 or 1x1), computed over bands of
// output rows when pre(x) would exceed band_bytes: then neither pre(x) nor oneDNN's blocked copies of the
// conv's input and output ever exist for the whole image. `scale` is output rows per input row (2 when `pre`
// upsamples). Each band's conv sees its rows plus the rows of context its kernel needs; the context rows'
// own outputs (wrong at a band's cut, where the conv pads with zeros) are dropped. Rows are independent, so
// the result is the unbanded conv's.
Tensor banded_conv(const nn::Conv2d& conv, const Tensor& x, int64_t band_bytes, int64_t scale = 1,
                   const std::function<Tensor(const Tensor&)>& pre = {}) {
  auto input = [&](const Tensor& t) { return pre ? pre(t) : t; };
  const int64_t H = x.size(2);
  const auto row_bytes = static_cast<int64_t>(x.size(0) * x.size(1) * x.size(3) * scale * scale *
                                              static_cast<int64_t>(dtype_size(x.dtype())));
  if (band_bytes <= 0 || row_bytes * H <= band_bytes) return conv(input(x));
  const int64_t halo = conv.weight.size(2) / 2;
  const int64_t context = (halo + scale - 1) / scale;  // input rows
  const int64_t rows = std::max<int64_t>(1, band_bytes / row_bytes);
  Tensor out;
  for (int64_t r0 = 0; r0 < H; r0 += rows) {
    const int64_t r1 = std::min(H, r0 + rows);
    const int64_t a = std::max<int64_t>(0, r0 - context), b = std::min(H, r1 + context);
    const Tensor band = conv(input(x.narrow(2, a, b - a)));
    if (!out.defined())
      out = Tensor::empty({band.size(0), band.size(1), H * scale, band.size(3)}, band.dtype(), band.device());
    out.narrow(2, r0 * scale, (r1 - r0) * scale).copy_(band.narrow(2, (r0 - a) * scale, (r1 - r0) * scale));
  }
  return out;
}

Tensor silu_of(const Tensor& t) {
  return silu(t);
}

// Whether banded_conv will split `x` into bands.
bool bands(const Tensor& x, int64_t band_bytes) {
  const auto row_bytes =
      static_cast<int64_t>(x.size(0) * x.size(1) * x.size(3) * static_cast<int64_t>(dtype_size(x.dtype())));
  return band_bytes > 0 && row_bytes * x.size(2) > band_bytes;
}

// silu(norm(x)) as a per-band function for banded_conv, so that the normalised image never exists whole:
// the GroupNorm statistics are taken over the whole image first (per sample and group, as group_norm does),
// and each band is normalised with them. Used for float32 only, where it is group_norm's formula in float32;
// lower precisions keep the whole-image group_norm kernel, which rounds once from float32.
std::function<Tensor(const Tensor&)> banded_norm_silu(const nn::GroupNorm& norm, const Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1), groups = norm.num_groups();
  const Tensor grouped = x.contiguous().view({n, groups, -1});
  const Tensor mu = mean(grouped, {2}, true);                              // [N, G, 1]
  const Tensor rstd = rsqrt(add(var(grouped, {2}, 0, true), norm.eps()));  // [N, G, 1]
  const Tensor mu_c = mu.expand({n, groups, c / groups}).reshape({n, c, 1, 1});
  const Tensor scale_c = mul(rstd.expand({n, groups, c / groups}).reshape({n, c, 1, 1}),
                             norm.weight.to(float32).view({1, c, 1, 1}));
  const Tensor bias_c = norm.bias.to(float32).view({1, c, 1, 1});
  return [mu_c, scale_c, bias_c](const Tensor& band) {
    return silu(add(mul(sub(band, mu_c), scale_c), bias_c));
  };
}

}  // namespace

Tensor AutoencoderKL::ResnetBlock::forward(Tensor x, int64_t band) const {
  // Order chosen for memory: the shortcut first, so that x (the largest tensor when the block narrows the
  // channels) can go as soon as it is normalised.
  Tensor residual = conv_shortcut ? banded_conv(*conv_shortcut, x, band) : x;
  Tensor h;
  if (x.dtype() == float32 && bands(x, band)) {
    // Large float32 images: normalise band by band (the whole normalised image would be the peak).
    h = banded_conv(conv1, x, band, 1, banded_norm_silu(norm1, x));
    x = Tensor();
    h = banded_conv(conv2, h, band, 1, banded_norm_silu(norm2, h));
    return add(residual, h);
  }
  h = norm1(x);
  x = Tensor();
  h = banded_conv(conv1, h, band, 1, silu_of);
  h = banded_conv(conv2, norm2(h), band, 1, silu_of);
  return add(residual, h);
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

Tensor AutoencoderKL::MidBlock::forward(Tensor x, int64_t band) const {
  x = resnet0.forward(std::move(x), band);
  if (attention) x = attention->forward(x);
  return resnet1.forward(std::move(x), band);
}

AutoencoderKL::Stage::Stage(int64_t in, int64_t out, int64_t layers, int64_t groups) {
  for (int64_t j = 0; j < layers; ++j) {
    resnets.push_back(std::make_unique<ResnetBlock>(j == 0 ? in : out, out, groups));
    register_module("resnets." + std::to_string(j), resnets.back().get());
  }
}

void AutoencoderKL::Stage::add_resample(const std::string& name, int64_t channels, int64_t stride,
                                        int64_t padding) {
  resample.emplace(channels, channels, 3, stride, padding);
  register_module(name, &*resample);
}

AutoencoderKL::AutoencoderKL(const AutoencoderKLConfig& c)
    : config_(c),
      enc_conv_in_(c.in_channels, c.block_out_channels.front(), 3, 1, 1),
      enc_mid_(c.block_out_channels.back(), c.norm_num_groups, c.mid_block_add_attention),
      enc_norm_out_(c.norm_num_groups, c.block_out_channels.back(), kEps),
      enc_conv_out_(c.block_out_channels.back(), 2 * c.latent_channels, 3, 1, 1),
      dec_conv_in_(c.latent_channels, c.decoder_channels().back(), 3, 1, 1),
      dec_mid_(c.decoder_channels().back(), c.norm_num_groups, c.mid_block_add_attention),
      dec_norm_out_(c.norm_num_groups, c.decoder_channels().front(), kEps),
      dec_conv_out_(c.decoder_channels().front(), c.out_channels, 3, 1, 1) {
  const auto& ch = c.block_out_channels;
  const size_t n = ch.size();
  register_module("encoder.conv_in", &enc_conv_in_);
  int64_t out = ch[0];
  for (size_t i = 0; i < n; ++i) {
    const int64_t in = out;
    out = ch[i];
    auto stage = std::make_unique<Stage>(in, out, c.layers_per_block, c.norm_num_groups);
    if (i + 1 < n) stage->add_resample("downsamplers.0.conv", out, 2, 0);
    register_module("encoder.down_blocks." + std::to_string(i), stage.get());
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
  const auto& dch = c.decoder_channels();
  out = dch[n - 1];
  for (size_t i = 0; i < n; ++i) {
    const int64_t in = out;
    out = dch[n - 1 - i];
    auto stage = std::make_unique<Stage>(in, out, c.layers_per_block + 1, c.norm_num_groups);
    if (i + 1 < n) stage->add_resample("upsamplers.0.conv", out, 1, 1);
    register_module("decoder.up_blocks." + std::to_string(i), stage.get());
    up_.push_back(std::move(stage));
  }
  register_module("decoder.conv_norm_out", &dec_norm_out_);
  register_module("decoder.conv_out", &dec_conv_out_);
  enable_tiling();  // resolves the default tile sizes
  use_tiling_ = false;
}

std::vector<nn::BlockList> AutoencoderKL::repeated_blocks() const {
  return {nn::block_list("encoder.down_blocks", down_), nn::block_list("decoder.up_blocks", up_)};
}

void AutoencoderKL::set_conv_band_bytes(int64_t bytes) {
  KILN_CHECK(bytes >= 0, "AutoencoderKL.set_conv_band_bytes: expected a size >= 0, got " << bytes);
  conv_band_bytes_ = bytes;
}

Shape AutoencoderKL::latent_shape(int64_t batch, int64_t height, int64_t width) const {
  const int64_t f = config_.scale_factor();
  return {batch, config_.latent_channels, height / f, width / f};
}

Tensor AutoencoderKL::to_latents(const Tensor& vae_latents) const {
  return mul(sub(vae_latents, config_.shift_factor), config_.scaling_factor);
}

Tensor AutoencoderKL::from_latents(const Tensor& latents) const {
  return add(div(latents, config_.scaling_factor), config_.shift_factor);
}

void AutoencoderKL::set_tiling(std::optional<int64_t> tile_size) {
  if (tile_size)
    enable_tiling({.tile_sample_min_size = *tile_size});
  else
    disable_tiling();
}

void AutoencoderKL::enable_tiling(const AutoencoderKLTiling& options) {
  AutoencoderKLTiling t = options;
  if (t.tile_sample_min_size == 0) t.tile_sample_min_size = config_.sample_size;
  // diffusers: int(sample_size / 2 ** (len(block_out_channels) - 1)).
  if (t.tile_latent_min_size == 0) t.tile_latent_min_size = t.tile_sample_min_size / config_.scale_factor();
  const double overlap = t.tile_overlap_factor;
  KILN_CHECK(overlap >= 0.0 && overlap < 1.0,
             "AutoencoderKL.enable_tiling: tile_overlap_factor must be in [0, 1), got " << overlap);
  // Both strides (int(size * (1 - overlap)), as diffusers computes them) must advance.
  KILN_CHECK(t.tile_latent_min_size > 0 && t.tile_sample_min_size > 0 &&
                 static_cast<int64_t>(t.tile_latent_min_size * (1 - overlap)) > 0 &&
                 static_cast<int64_t>(t.tile_sample_min_size * (1 - overlap)) > 0,
             "AutoencoderKL.enable_tiling: tiles of " << t.tile_sample_min_size << " pixels / "
                                                      << t.tile_latent_min_size << " latents with overlap "
                                                      << overlap << " do not advance");
  tiling_ = t;
  use_tiling_ = true;
}

namespace {

// diffusers' blend_v (dim 2) / blend_h (dim 3): the first `extent` rows (columns) of b fade in from the last
// ones of a, in place. The weights are computed in double and each product is rounded to the tensor's dtype,
// as torch does with a Python float.
void blend(const Tensor& a, Tensor& b, int64_t dim, int64_t extent) {
  extent = std::min({a.size(dim), b.size(dim), extent});
  for (int64_t y = 0; y < extent; ++y) {
    const double w = static_cast<double>(y) / static_cast<double>(extent);
    Tensor line = b.narrow(dim, y, 1);
    line.copy_(add(mul(a.narrow(dim, a.size(dim) - extent + y, 1), 1.0 - w), mul(line, w)));
  }
}

// diffusers' tiling loop, shared by decode and encode: `run` maps each input tile (input_tile square, every
// `stride` along H and W) to an output tile; output tiles are blended with their upper and left neighbours
// over `blend_extent` and cropped to `row_limit`. Rows are stitched as soon as they are done, so only two
// rows of output tiles are alive at a time.
template <class Run>
Tensor run_tiled(const Tensor& x, int64_t input_tile, int64_t stride, int64_t blend_extent, int64_t row_limit,
                 const Run& run) {
  const int64_t H = x.size(2), W = x.size(3);
  std::vector<Tensor> above, stitched_rows;
  for (int64_t i = 0; i < H; i += stride) {
    std::vector<Tensor> row;
    for (int64_t j = 0; j < W; j += stride)
      row.push_back(
          run(x.narrow(2, i, std::min(input_tile, H - i)).narrow(3, j, std::min(input_tile, W - j))));
    std::vector<Tensor> crops;
    for (size_t j = 0; j < row.size(); ++j) {
      Tensor& tile = row[j];
      if (!above.empty()) blend(above[j], tile, 2, blend_extent);
      if (j > 0) blend(row[j - 1], tile, 3, blend_extent);
      crops.push_back(tile.narrow(2, 0, std::min(row_limit, tile.size(2)))
                          .narrow(3, 0, std::min(row_limit, tile.size(3))));
    }
    stitched_rows.push_back(crops.size() == 1 ? crops.front().contiguous() : concat(crops, 3));
    above = std::move(row);
  }
  return stitched_rows.size() == 1 ? stitched_rows.front() : concat(stitched_rows, 2);
}

}  // namespace

Tensor AutoencoderKL::decode(const Tensor& latents) const {
  const Tensor z = on_weights_device(latents);
  KILN_CHECK(z.dim() == 4 && z.size(1) == config_.latent_channels,
             "AutoencoderKL.decode: expected latents [B, " << config_.latent_channels << ", h, w], got "
                                                           << shape_str(z.shape()));
  if (use_tiling_ && (z.size(2) > tiling_.tile_latent_min_size || z.size(3) > tiling_.tile_latent_min_size))
    return tiled_decode(z);
  return decoder_forward(z);
}

Tensor AutoencoderKL::tiled_decode(const Tensor& z) const {
  KILN_CHECK(z.dim() == 4 && z.size(1) == config_.latent_channels,
             "AutoencoderKL.tiled_decode: expected latents [B, " << config_.latent_channels << ", h, w], got "
                                                                 << shape_str(z.shape()));
  const auto& t = tiling_;
  const auto stride = static_cast<int64_t>(t.tile_latent_min_size * (1 - t.tile_overlap_factor));
  const auto blend_extent = static_cast<int64_t>(t.tile_sample_min_size * t.tile_overlap_factor);
  return run_tiled(z, t.tile_latent_min_size, stride, blend_extent, t.tile_sample_min_size - blend_extent,
                   [&](const Tensor& tile) { return decoder_forward(tile); });
}

Tensor AutoencoderKL::decoder_forward(const Tensor& z) const {
  Tensor x = post_quant_conv_ ? (*post_quant_conv_)(z) : z;
  const int64_t band = conv_band_bytes_;
  x = dec_conv_in_(x);
  x = dec_mid_.forward(std::move(x), band);
  for (const auto& stage : up_) {
    for (const auto& r : stage->resnets) x = r->forward(std::move(x), band);
    if (stage->resample)
      x = banded_conv(*stage->resample, x, band, 2, [](const Tensor& t) { return upsample_nearest2d(t, 2); });
  }
  x = dec_norm_out_(x);
  return banded_conv(dec_conv_out_, x, band, 1, silu_of);
}

AutoencoderKL::LatentDistribution AutoencoderKL::encode(const Tensor& pixels) const {
  const Tensor image = on_weights_device(pixels);
  KILN_CHECK(image.dim() == 4 && image.size(1) == config_.in_channels,
             "AutoencoderKL.encode: expected images [B, " << config_.in_channels << ", H, W], got "
                                                          << shape_str(image.shape()));
  const int64_t f = config_.scale_factor();
  KILN_CHECK(image.size(2) % f == 0 && image.size(3) % f == 0, "AutoencoderKL.encode: image size "
                                                                   << image.size(2) << "x" << image.size(3)
                                                                   << " is not a multiple of " << f);
  if (use_tiling_ &&
      (image.size(2) > tiling_.tile_sample_min_size || image.size(3) > tiling_.tile_sample_min_size))
    return tiled_encode(image);
  return split_moments(encoder_forward(image));
}

AutoencoderKL::LatentDistribution AutoencoderKL::tiled_encode(const Tensor& image) const {
  KILN_CHECK(image.dim() == 4 && image.size(1) == config_.in_channels,
             "AutoencoderKL.tiled_encode: expected images [B, " << config_.in_channels << ", H, W], got "
                                                                << shape_str(image.shape()));
  const auto& t = tiling_;
  const auto stride = static_cast<int64_t>(t.tile_sample_min_size * (1 - t.tile_overlap_factor));
  const auto blend_extent = static_cast<int64_t>(t.tile_latent_min_size * t.tile_overlap_factor);
  return split_moments(run_tiled(image, t.tile_sample_min_size, stride, blend_extent,
                                 t.tile_latent_min_size - blend_extent,
                                 [&](const Tensor& tile) { return encoder_forward(tile); }));
}

Tensor AutoencoderKL::encoder_forward(const Tensor& image) const {
  Tensor x = enc_conv_in_(image);
  for (const auto& stage : down_) {
    for (const auto& r : stage->resnets) x = r->forward(std::move(x), conv_band_bytes_);
    if (stage->resample) {
      // diffusers' Downsample2D pads one zero row and column at the bottom/right, then convolves with
      // stride 2.
      Tensor padded =
          Tensor::zeros({x.size(0), x.size(1), x.size(2) + 1, x.size(3) + 1}, x.dtype(), x.device());
      padded.narrow(2, 0, x.size(2)).narrow(3, 0, x.size(3)).copy_(x);
      x = (*stage->resample)(padded);
    }
  }
  x = enc_mid_.forward(std::move(x), conv_band_bytes_);
  x = enc_conv_out_(silu(enc_norm_out_(x)));
  if (quant_conv_) x = (*quant_conv_)(x);
  return x;
}

AutoencoderKL::LatentDistribution AutoencoderKL::split_moments(const Tensor& moments) const {
  const auto halves = chunk(moments, 2, 1);
  // diffusers clamps the log-variance to [-30, 20] before use.
  return {halves[0], clamp(halves[1], -30.0, 20.0)};
}

std::unique_ptr<AutoencoderKL> load_autoencoder_kl(const std::string& folder, DType dtype,
                                                   const nn::WeightSource* from) {
  const AutoencoderKLConfig config = AutoencoderKLConfig::from_file(folder + "/config.json");
  KILN_CHECK(!config.flux2, folder << "/config.json: an AutoencoderKLFlux2 (FLUX.2 VAE); load it with "
                                      "load_autoencoder_kl_flux2");
  auto model = std::make_unique<AutoencoderKL>(config);
  nn::LoadOptions options;
  options.dtype = dtype;
  if (from != nullptr) {
    model->load_weights(*from, options);
    return model;
  }
  nn::CheckpointWeights weights(folder);
  model->load_weights(weights, options);
  return model;
}

}  // namespace kiln::models
