#include "kiln/families/qwen_image/qwen2_vl_image_processor.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/io/json_config.h"

namespace kiln::models {
namespace {

// torch's separable antialiased bicubic weights for one axis, rounded to int16 as its uint8 kernels use them
// (the Keys kernel with a = -0.5, stretched by the scale when shrinking; each output's taps normalised to sum
// to one in double, then scaled by 2^precision, precision the largest keeping the biggest weight below 2^15).
struct AxisWeights {
  std::vector<int64_t> first, count;  // per output: its first input and number of taps
  std::vector<int32_t> weights;       // per output: max_taps weights
  int64_t max_taps = 0;
  int precision = 0;
};

double keys_cubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
  return 0.0;
}

AxisWeights axis_weights(int64_t in, int64_t out) {
  AxisWeights r;
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  r.max_taps = static_cast<int64_t>(std::ceil(static_cast<float>(support))) * 2 + 1;
  std::vector<double> w(static_cast<size_t>(out * r.max_taps), 0.0);
  double wt_max = 0.0;
  for (int64_t i = 0; i < out; ++i) {
    const double center = scale * (static_cast<double>(i) + 0.5);
    const int64_t first = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t count = std::clamp<int64_t>(
        std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in) - first, 0, r.max_taps);
    double total = 0.0;
    double* row = w.data() + i * r.max_taps;
    for (int64_t j = 0; j < count; ++j) {
      row[j] = keys_cubic((static_cast<double>(j + first) - center + 0.5) * invscale);
      total += row[j];
    }
    if (total != 0.0) {
      for (int64_t j = 0; j < count; ++j) {
        row[j] /= total;
        wt_max = std::max(wt_max, row[j]);
      }
    }
    r.first.push_back(first);
    r.count.push_back(count);
  }
  for (r.precision = 0; r.precision < 22; ++r.precision) {
    if (static_cast<int>(0.5 + wt_max * static_cast<double>(1 << (r.precision + 1))) >= (1 << 15)) break;
  }
  r.weights.resize(w.size());
  for (size_t k = 0; k < w.size(); ++k) {
    const double v = w[k] * static_cast<double>(1 << r.precision);
    r.weights[k] = v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v);
  }
  return r;
}

// One pass over planes [C, rows, cols] along rows (horizontal) or down columns (vertical), rounded to 8 bits.
std::vector<uint8_t> resample(const std::vector<uint8_t>& in, int64_t C, int64_t rows, int64_t cols,
                              bool horizontal, int64_t out_size) {
  const AxisWeights a = axis_weights(horizontal ? cols : rows, out_size);
  const int64_t out_rows = horizontal ? rows : out_size, out_cols = horizontal ? out_size : cols;
  std::vector<uint8_t> out(static_cast<size_t>(C * out_rows * out_cols));
  const int32_t half = a.precision > 0 ? 1 << (a.precision - 1) : 0;
  for (int64_t c = 0; c < C; ++c) {
    const uint8_t* plane = in.data() + c * rows * cols;
    for (int64_t y = 0; y < out_rows; ++y) {
      for (int64_t x = 0; x < out_cols; ++x) {
        const int64_t o = horizontal ? x : y;
        const int32_t* w = a.weights.data() + o * a.max_taps;
        int32_t sum = half;
        for (int64_t j = 0; j < a.count[static_cast<size_t>(o)]; ++j) {
          const int64_t src = a.first[static_cast<size_t>(o)] + j;
          sum += static_cast<int32_t>(horizontal ? plane[y * cols + src] : plane[src * cols + x]) * w[j];
        }
        out[static_cast<size_t>((c * out_rows + y) * out_cols + x)] =
            static_cast<uint8_t>(std::clamp(sum >> a.precision, 0, 255));
      }
    }
  }
  return out;
}

}  // namespace

Qwen2VLImageProcessorConfig Qwen2VLImageProcessorConfig::from_file(const std::string& path) {
  const auto file = io::JsonConfig::load(path);
  const io::JsonConfig c = file.has("image_processor") ? file.object("image_processor") : file;
  Qwen2VLImageProcessorConfig r;
  // As transformers' __init__: the size dict first, top-level min_pixels / max_pixels over it.
  if (c.has("size")) {
    const auto size = c.object("size");
    r.min_pixels = size.get_or<int64_t>("shortest_edge", size.get_or<int64_t>("min_pixels", r.min_pixels));
    r.max_pixels = size.get_or<int64_t>("longest_edge", size.get_or<int64_t>("max_pixels", r.max_pixels));
  }
  r.min_pixels = c.get_or<int64_t>("min_pixels", r.min_pixels);
  r.max_pixels = c.get_or<int64_t>("max_pixels", r.max_pixels);
  r.patch_size = c.get_or<int64_t>("patch_size", r.patch_size);
  r.temporal_patch_size = c.get_or<int64_t>("temporal_patch_size", r.temporal_patch_size);
  r.merge_size = c.get_or<int64_t>("merge_size", r.merge_size);
  r.do_resize = c.get_or<bool>("do_resize", r.do_resize);
  r.do_rescale = c.get_or<bool>("do_rescale", r.do_rescale);
  r.do_normalize = c.get_or<bool>("do_normalize", r.do_normalize);
  r.rescale_factor = c.get_or<double>("rescale_factor", r.rescale_factor);
  r.image_mean = c.get_or<std::vector<double>>("image_mean", r.image_mean);
  r.image_std = c.get_or<std::vector<double>>("image_std", r.image_std);
  const int64_t resample = c.get_or<int64_t>("resample", 3);
  KILN_CHECK(resample == 3, c.where("resample") << ": only bicubic (3) is supported, got " << resample);
  for (auto [name, v] : {std::pair<const char*, int64_t>{"min_pixels", r.min_pixels},
                         {"max_pixels", r.max_pixels},
                         {"patch_size", r.patch_size},
                         {"temporal_patch_size", r.temporal_patch_size},
                         {"merge_size", r.merge_size}}) {
    KILN_CHECK(v > 0, c.where(name) << ": must be positive, got " << v);
  }
  limits::check_config(path, {{"max_pixels", r.max_pixels, limits::kMaxImageSide * limits::kMaxImageSide},
                              {"patch_size * merge_size", r.patch_size * r.merge_size, 4096},
                              {"temporal_patch_size", r.temporal_patch_size, 64}});
  KILN_CHECK(r.min_pixels <= r.max_pixels,
             c.where("min_pixels") << ": " << r.min_pixels << " is above max_pixels " << r.max_pixels);
  KILN_CHECK(r.image_mean.size() == 3 && r.image_std.size() == 3,
             c.where("image_mean") << ": expected 3 values each for image_mean and image_std");
  for (double s : r.image_std) KILN_CHECK(s > 0, c.where("image_std") << ": must be positive, got " << s);
  KILN_CHECK(std::isfinite(r.rescale_factor) && r.rescale_factor > 0,
             c.where("rescale_factor") << ": must be positive, got " << r.rescale_factor);
  return r;
}

Qwen2VLImageProcessorConfig Qwen2VLImageProcessorConfig::from_folder(const std::string& folder) {
  const std::string pre = folder + "/preprocessor_config.json";
  return from_file(std::filesystem::exists(pre) ? pre : folder + "/processor_config.json");
}

std::pair<int64_t, int64_t> qwen2_vl_smart_resize(int64_t height, int64_t width, int64_t factor,
                                                  int64_t min_pixels, int64_t max_pixels) {
  KILN_CHECK(height > 0 && width > 0, "Qwen2-VL image processor: empty image " << width << "x" << height);
  const double h = static_cast<double>(height), w = static_cast<double>(width),
               f = static_cast<double>(factor);
  KILN_CHECK(std::max(h, w) / std::min(h, w) <= 200,
             "Qwen2-VL image processor: a "
                 << width << "x" << height
                 << " image's aspect ratio is over 200, which the processor refuses");
  // Python's round: ties to even, as nearbyint in the default rounding mode.
  int64_t h_bar = static_cast<int64_t>(std::nearbyint(h / f)) * factor;
  int64_t w_bar = static_cast<int64_t>(std::nearbyint(w / f)) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return {h_bar, w_bar};
}

QwenVLImageInput qwen2_vl_preprocess(const Image& image, const Qwen2VLImageProcessorConfig& config) {
  const int64_t H = image.height, W = image.width, C = 3, ch = image.channels;
  KILN_CHECK(H > 0 && W > 0 && H <= limits::kMaxImageSide && W <= limits::kMaxImageSide &&
                 (ch == 1 || ch == 2 || ch == 3 || ch == 4) &&
                 image.pixels.size() == static_cast<size_t>(H * W * ch),
             "Qwen2-VL image processor: expected an image of 1 to "
                 << limits::kMaxImageSide << " pixels a side, 1 to 4 channels, got " << W << "x" << H << "x"
                 << ch);
  const int64_t factor = config.patch_size * config.merge_size;
  // Planes [3, H, W]; gray replicated, alpha dropped (PIL's convert("RGB")).
  std::vector<uint8_t> planes(static_cast<size_t>(C * H * W));
  for (int64_t c = 0; c < C; ++c) {
    const int64_t from = ch < 3 ? 0 : c;
    for (int64_t p = 0; p < H * W; ++p)
      planes[static_cast<size_t>(c * H * W + p)] = image.pixels[p * ch + from];
  }
  int64_t h = H, w = W;
  if (config.do_resize) {
    const auto [rh, rw] = qwen2_vl_smart_resize(H, W, factor, config.min_pixels, config.max_pixels);
    if (rw != w) planes = resample(planes, C, h, w, true, rw);
    w = rw;
    if (rh != h) planes = resample(planes, C, h, w, false, rh);
    h = rh;
  }
  KILN_CHECK(h % factor == 0 && w % factor == 0, "Qwen2-VL image processor: a "
                                                     << w << "x" << h
                                                     << " image (not resized) must have sides multiple of "
                                                     << factor << " (patch_size * merge_size)");
  // Rescale and normalise fused, in float32, as the torchvision backend: mean and std scaled by
  // 1 / rescale_factor first.
  std::vector<float> mean(3), std_(3);
  const float inverse = static_cast<float>(1.0 / config.rescale_factor);
  for (size_t c = 0; c < 3; ++c) {
    mean[c] = static_cast<float>(config.image_mean[c]);
    std_[c] = static_cast<float>(config.image_std[c]);
    if (config.do_rescale && config.do_normalize) {
      mean[c] *= inverse;
      std_[c] *= inverse;
    }
  }
  const float rescale = static_cast<float>(config.rescale_factor);
  auto value = [&](int64_t c, int64_t y, int64_t x) {
    const float v = planes[static_cast<size_t>((c * h + y) * w + x)];
    if (config.do_normalize) return (v - mean[static_cast<size_t>(c)]) / std_[static_cast<size_t>(c)];
    return config.do_rescale ? v * rescale : v;
  };
  const int64_t P = config.patch_size, M = config.merge_size, T = config.temporal_patch_size;
  const int64_t gh = h / P, gw = w / P, row_size = C * T * P * P;
  std::vector<float> out(static_cast<size_t>(gh * gw * row_size));
  size_t at = 0;
  // Rows: merge blocks row-major, patches row-major inside; values: channel, frame (repeated), row, column.
  for (int64_t bh = 0; bh < gh / M; ++bh) {
    for (int64_t bw = 0; bw < gw / M; ++bw) {
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < M; ++j) {
          const int64_t y0 = (bh * M + i) * P, x0 = (bw * M + j) * P;
          for (int64_t c = 0; c < C; ++c) {
            for (int64_t t = 0; t < T; ++t) {
              for (int64_t y = 0; y < P; ++y) {
                for (int64_t x = 0; x < P; ++x) out[at++] = value(c, y0 + y, x0 + x);
              }
            }
          }
        }
      }
    }
  }
  return {Tensor::from_vector(out, {gh * gw, row_size}), ImageGrid{1, gh, gw}};
}

std::string qwen2_vl_expand_image_tokens(const std::string& text, const std::vector<ImageGrid>& grids,
                                         int64_t merge_size) {
  static const std::string pad = "<|image_pad|>";
  std::string out;
  size_t from = 0, image = 0;
  for (size_t at = text.find(pad); at != std::string::npos; at = text.find(pad, from)) {
    KILN_CHECK(image < grids.size(), "Qwen2-VL processor: the text has more "
                                         << pad << " tokens than the " << grids.size() << " images given");
    out.append(text, from, at - from);
    const int64_t tokens = grids[image++].patches() / (merge_size * merge_size);
    for (int64_t k = 0; k < tokens; ++k) out += pad;
    from = at + pad.size();
  }
  KILN_CHECK(image == grids.size(), "Qwen2-VL processor: the text has " << image << " " << pad
                                                                        << " tokens for " << grids.size()
                                                                        << " images");
  out.append(text, from, std::string::npos);
  return out;
}

}  // namespace kiln::models
