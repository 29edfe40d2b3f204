// PNG files for generated images (libpng). Writing is atomic: the image appears complete at `path` or not at
// all, so a crash or a full disk never leaves a truncated image (or destroys the previous one).
// Text chunks carry generation parameters (prompt, seed, steps, model) the way other tools read them:
// tEXt for Latin-1 text, iTXt (UTF-8) for anything else.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::io {

// Writes 8-bit pixels, rows top to bottom, channels interleaved (HWC): 1 gray, 2 gray+alpha, 3 RGB,
// 4 RGBA. `pixels` must hold width * height * channels bytes. Keys must be 1-79 Latin-1 printable characters
// without leading, trailing or double spaces (the PNG rule). Throws kiln::Error naming `path`.
void write_png(const std::string& path, const uint8_t* pixels, int width, int height, int channels,
               const std::map<std::string, std::string>& text = {});
inline void write_png(const std::string& path, const std::vector<uint8_t>& pixels, int width, int height,
                      int channels, const std::map<std::string, std::string>& text = {}) {
  write_png(path, pixels.data(), width, height, channels, text);
}

// The bytes write_png would write, in memory (an image served over HTTP). Same checks; throws kiln::Error.
std::string encode_png(const uint8_t* pixels, int width, int height, int channels,
                       const std::map<std::string, std::string>& text = {});

struct PngImage {
  int width = 0;
  int height = 0;
  int channels = 0;                         // 1, 2, 3 or 4, as stored (palettes become RGB/RGBA)
  std::vector<uint8_t> pixels;              // HWC, 8 bits per channel (16-bit files are reduced)
  std::map<std::string, std::string> text;  // tEXt, zTXt and iTXt chunks (iTXt as UTF-8)
};

// Reads any PNG; throws kiln::Error naming `path` when it is missing or not a valid PNG.
PngImage read_png(const std::string& path);
// The same from a PNG file's bytes in memory (an upload), named `name` in errors; refuses an image of more
// than `max_pixels` pixels from its header, before decoding it.
PngImage decode_png(std::string_view bytes, const std::string& name, int64_t max_pixels);

}  // namespace kiln::io
