#include "pipelines/pil_convert.h"

#include <algorithm>

#include "kiln/core/error.h"

namespace kiln::pipelines {

namespace {

Image with_channels(const Image& image, int channels) {
  Image out;
  out.width = image.width;
  out.height = image.height;
  out.channels = channels;
  out.pixels.resize(static_cast<size_t>(image.width) * image.height * channels);
  return out;
}

}  // namespace

void check_image(const Image& image, const char* what) {
  KILN_CHECK(image.channels >= 1 && image.channels <= 4 && image.width > 0 && image.height > 0 &&
                 image.pixels.size() == static_cast<size_t>(image.width) * image.height * image.channels,
             what << ": expected 8-bit pixels with 1 to 4 channels, got a " << image.width << "x"
                  << image.height << "x" << image.channels << " image of " << image.pixels.size()
                  << " bytes");
}

Image to_rgb(const Image& image) {
  if (image.channels == 3) return image;
  Image rgb = with_channels(image, 3);
  const size_t n = static_cast<size_t>(image.width) * image.height;
  const size_t ch = static_cast<size_t>(image.channels);
  for (size_t i = 0; i < n; ++i)
    for (size_t c = 0; c < 3; ++c) rgb.pixels[i * 3 + c] = image.pixels[i * ch + (ch >= 3 ? c : 0)];
  return rgb;
}

Image to_luma(const Image& image) {
  if (image.channels == 1) return image;
  Image l = with_channels(image, 1);
  const size_t n = static_cast<size_t>(image.width) * image.height;
  const size_t ch = static_cast<size_t>(image.channels);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = &image.pixels[i * ch];
    l.pixels[i] =
        ch >= 3 ? static_cast<uint8_t>((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16) : p[0];
  }
  return l;
}

Image crop(const Image& image, int left, int top, int width, int height) {
  KILN_CHECK(left >= 0 && top >= 0 && width >= 0 && height >= 0 && left + width <= image.width &&
                 top + height <= image.height,
             "crop: the box (" << left << ", " << top << ", " << left + width << ", " << top + height
                               << ") is not inside the " << image.width << "x" << image.height << " image");
  Image out = with_channels(image, image.channels);
  out.width = width;
  out.height = height;
  const size_t ch = static_cast<size_t>(image.channels), row = static_cast<size_t>(width) * ch;
  out.pixels.resize(static_cast<size_t>(height) * row);
  for (int y = 0; y < height; ++y)
    std::copy_n(&image.pixels[(static_cast<size_t>(top + y) * image.width + left) * ch], row,
                &out.pixels[static_cast<size_t>(y) * row]);
  return out;
}

}  // namespace kiln::pipelines
