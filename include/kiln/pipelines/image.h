// A generated image: 8-bit RGB pixels (HWC) plus the generation parameters that are stored with it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln {

struct Image {
  int width = 0;
  int height = 0;
  int channels = 3;
  std::vector<uint8_t> pixels;                  // HWC, rows top to bottom
  std::map<std::string, std::string> metadata;  // written as PNG text chunks: prompt, seed, steps, model, ...

  // Writes a PNG atomically (never a half-written file); throws kiln::Error naming the path.
  void save(const std::string& path) const;
  // The PNG file save() writes, as bytes in memory (the same text chunks).
  std::string encode_png() const;
  // Reads a PNG (gray, gray + alpha, RGB or RGBA, as stored; its text chunks become the metadata), e.g. a
  // reference image for FLUX.2; throws kiln::Error naming the path.
  static Image load(const std::string& path);
  // The same from a PNG file's bytes (an upload), `name` in errors; at most `max_pixels` pixels.
  static Image decode_png(std::string_view bytes, const std::string& name, int64_t max_pixels);

  // From a float image [H, W, C] in [0, 1] (diffusers' output_type="np"): round(x * 255) with ties to even,
  // as diffusers' numpy_to_pil does.
  static Image from_float(const Tensor& hwc);
};

}  // namespace kiln
