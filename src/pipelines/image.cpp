#include "kiln/pipelines/image.h"

#include <cmath>

#include "kiln/io/png.h"

namespace kiln {

void Image::save(const std::string& path) const {
  KILN_CHECK(
      static_cast<int64_t>(pixels.size()) == int64_t{width} * height * channels,
      "Image::save: " << pixels.size() << " bytes do not fill " << width << "x" << height << "x" << channels);
  io::write_png(path, pixels, width, height, channels, metadata);
}

std::string Image::encode_png() const {
  KILN_CHECK(static_cast<int64_t>(pixels.size()) == int64_t{width} * height * channels,
             "Image::encode_png: " << pixels.size() << " bytes do not fill " << width << "x" << height << "x"
                                   << channels);
  return io::encode_png(pixels.data(), width, height, channels, metadata);
}

namespace {

Image from_png(io::PngImage png) {
  Image image;
  image.width = png.width;
  image.height = png.height;
  image.channels = png.channels;
  image.pixels = std::move(png.pixels);
  image.metadata = std::move(png.text);
  return image;
}

}  // namespace

Image Image::load(const std::string& path) {
  return from_png(io::read_png(path));
}

Image Image::decode_png(std::string_view bytes, const std::string& name, int64_t max_pixels) {
  return from_png(io::decode_png(bytes, name, max_pixels));
}

Image Image::from_float(const Tensor& hwc) {
  KILN_CHECK(hwc.dim() == 3 && (hwc.size(2) == 1 || hwc.size(2) == 3 || hwc.size(2) == 4),
             "Image::from_float: expected [height, width, channels] with 1, 3 or 4 channels, got "
                 << shape_str(hwc.shape()));
  Image image;
  image.height = static_cast<int>(hwc.size(0));
  image.width = static_cast<int>(hwc.size(1));
  image.channels = static_cast<int>(hwc.size(2));
  const auto values = hwc.to_vector<float>();
  image.pixels.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    // numpy: (images * 255).round().astype("uint8") in float32; values are already clamped to [0, 1].
    const float scaled = values[i] * 255.0f;
    const float r =
        std::nearbyint(std::min(std::max(scaled, 0.0f), 255.0f));  // default rounding: ties to even
    image.pixels[i] = static_cast<uint8_t>(r);
  }
  return image;
}

}  // namespace kiln
