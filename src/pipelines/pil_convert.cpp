#include "pipelines/pil_convert.h"

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

}  // namespace kiln::pipelines
