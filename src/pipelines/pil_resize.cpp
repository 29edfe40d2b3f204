#include "pipelines/pil_resize.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "kiln/core/error.h"
#include "pipelines/pil_convert.h"

namespace kiln::pipelines {

namespace {

// Pillow: 32 bits minus 8 for the pixel values and 2 for the filter's negative and overshooting lobes.
constexpr int kPrecisionBits = 32 - 8 - 2;

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x = x * std::numbers::pi;
  return std::sin(x) / x;
}

double lanczos(double x) {
  return (-3.0 <= x && x < 3.0) ? sinc(x) * sinc(x / 3) : 0.0;
}

// Pillow's bicubic convolution with a = -0.5.
double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

struct Filter {
  double (*weight)(double);
  double support;
};

Filter filter_of(ResizeFilter f) {
  return f == ResizeFilter::Bicubic ? Filter{bicubic, 2.0} : Filter{lanczos, 3.0};
}

// precompute_coeffs + normalize_coeffs_8bpc: for each output position its first input and the fixed-point
// weights of the inputs it reads.
struct Coefficients {
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // [out_size, ksize]
  int ksize = 0;
};

// The source extent [in0, in1] is a pair of C floats in Pillow; their difference is taken in float.
Coefficients coefficients(const Filter& filter, int in_size, float in0, float in1, int out_size) {
  const double scale = static_cast<double>(in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = filter.support * filterscale;
  Coefficients c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(static_cast<size_t>(out_size));
  c.count.resize(static_cast<size_t>(out_size));
  c.weights.assign(static_cast<size_t>(out_size) * static_cast<size_t>(c.ksize), 0);
  const double inv_filterscale = 1.0 / filterscale;
  std::vector<double> k(static_cast<size_t>(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in_size) - xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[static_cast<size_t>(x)] = filter.weight((x + xmin - center + 0.5) * inv_filterscale);
      ww += k[static_cast<size_t>(x)];
    }
    for (int x = 0; x < xmax; ++x) {
      double w = k[static_cast<size_t>(x)];
      if (ww != 0.0) w /= ww;
      const double fixed = w * (1 << kPrecisionBits);
      c.weights[static_cast<size_t>(xx) * static_cast<size_t>(c.ksize) + static_cast<size_t>(x)] =
          static_cast<int32_t>(w < 0 ? -0.5 + fixed : 0.5 + fixed);
    }
    c.first[static_cast<size_t>(xx)] = xmin;
    c.count[static_cast<size_t>(xx)] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t v) {
  // Pillow's clip8 lookup: the arithmetic shift floors, then [0, 255].
  return static_cast<uint8_t>(std::clamp(v >> kPrecisionBits, 0, 255));
}

// One pass along x (horizontal) or y of a [height, width, channels] image.
Image resample(const Image& in, const Coefficients& c, int out_size, bool horizontal) {
  Image out;
  out.channels = in.channels;
  out.width = horizontal ? out_size : in.width;
  out.height = horizontal ? in.height : out_size;
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * out.channels);
  const size_t ch = static_cast<size_t>(in.channels);
  for (int y = 0; y < out.height; ++y) {
    for (int x = 0; x < out.width; ++x) {
      const int o = horizontal ? x : y;
      const int32_t* k = &c.weights[static_cast<size_t>(o) * static_cast<size_t>(c.ksize)];
      for (size_t b = 0; b < ch; ++b) {
        int32_t ss = 1 << (kPrecisionBits - 1);
        for (int i = 0; i < c.count[static_cast<size_t>(o)]; ++i) {
          const int src = c.first[static_cast<size_t>(o)] + i;
          const size_t at = horizontal ? (static_cast<size_t>(y) * in.width + src) * ch + b
                                       : (static_cast<size_t>(src) * in.width + x) * ch + b;
          ss += static_cast<int32_t>(in.pixels[at]) * k[i];
        }
        out.pixels[(static_cast<size_t>(y) * out.width + x) * ch + b] = clip8(ss);
      }
    }
  }
  return out;
}

}  // namespace

Image resize_lanczos(const Image& image, int width, int height) {
  return resize_pil(image, width, height, ResizeFilter::Lanczos,
                    {0, 0, static_cast<float>(image.width), static_cast<float>(image.height)});
}

Image resize_pil(const Image& image, int width, int height, ResizeFilter filter_kind, const ResizeBox& box) {
  const Filter filter = filter_of(filter_kind);
  KILN_CHECK(width >= 1 && height >= 1 && image.width >= 1 && image.height >= 1 && image.channels >= 1 &&
                 image.pixels.size() == static_cast<size_t>(image.width) * image.height * image.channels,
             "resize_lanczos: cannot resize a " << image.width << "x" << image.height << "x" << image.channels
                                                << " image to " << width << "x" << height);
  KILN_CHECK(box.left >= 0 && box.top >= 0 && box.right <= static_cast<float>(image.width) &&
                 box.bottom <= static_cast<float>(image.height) && box.right >= box.left &&
                 box.bottom >= box.top,
             "resize_lanczos: the box (" << box.left << ", " << box.top << ", " << box.right << ", "
                                         << box.bottom << ") is not inside the " << image.width << "x"
                                         << image.height << " image");
  const bool whole = box.left == 0 && box.top == 0 && box.right == static_cast<float>(image.width) &&
                     box.bottom == static_cast<float>(image.height);
  if (whole && width == image.width && height == image.height) return image;  // Image.resize: a copy
  // _imaging.c's resize: an integral box of the output's size is a crop, not a filter.
  if (box.left == std::floor(box.left) && box.top == std::floor(box.top) &&
      box.right - box.left == static_cast<float>(width) &&
      box.bottom - box.top == static_cast<float>(height)) {
    Image out = crop(image, static_cast<int>(box.left), static_cast<int>(box.top), width, height);
    out.metadata = image.metadata;
    return out;
  }
  // Pillow compares the box's far edge with the output's size, not the input's.
  const bool need_horizontal =
      width != image.width || box.left != 0 || box.right != static_cast<float>(width);
  const bool need_vertical =
      height != image.height || box.top != 0 || box.bottom != static_cast<float>(height);
  // Pillow runs the vertical pass first when the height shrinks more than twice as much as the width. (When
  // horizontal first, it filters only the rows the vertical pass reads: the same values.)
  const bool horizontal_first =
      !((image.height - height) > 0 && (image.height - height) > (image.width - width) * 2);
  Image out = image;
  auto pass = [&](bool horizontal) {
    if (horizontal && need_horizontal)
      out = resample(out, coefficients(filter, image.width, box.left, box.right, width), width, true);
    if (!horizontal && need_vertical)
      out = resample(out, coefficients(filter, image.height, box.top, box.bottom, height), height, false);
  };
  pass(horizontal_first);
  pass(!horizontal_first);
  out.metadata = image.metadata;
  return out;
}

}  // namespace kiln::pipelines
