// PNG round trips (pixels and text chunks) and atomic writes that never leave a partial file.
#include "kiln/io/png.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <random>

#include "io/io_test_util.h"
#include "kiln/pipelines/image.h"
#include "support/test_data.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::temp_dir;

std::vector<uint8_t> noise(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

size_t entries_in(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

TEST(Png, RoundTripsEveryChannelCountAndOddSizes) {
  const std::string dir = temp_dir("png_roundtrip");
  for (int channels = 1; channels <= 4; ++channels) {
    for (auto [w, h] : {std::pair{1, 1}, {17, 5}, {3, 64}}) {
      SCOPED_TRACE(std::to_string(channels) + " channels, " + std::to_string(w) + "x" + std::to_string(h));
      const auto pixels =
          noise(static_cast<size_t>(w * h * channels), static_cast<unsigned>(channels * 100 + w));
      const std::string path = dir + "/img.png";
      io::write_png(path, pixels, w, h, channels);
      const io::PngImage img = io::read_png(path);
      EXPECT_EQ(img.width, w);
      EXPECT_EQ(img.height, h);
      EXPECT_EQ(img.channels, channels);
      EXPECT_EQ(img.pixels, pixels);
      EXPECT_TRUE(img.text.empty());
    }
  }
}

TEST(Png, StoresGenerationParametersAsText) {
  const std::string path = temp_dir("png_text") + "/gen.png";
  const std::map<std::string, std::string> text = {
      {"prompt", "a red fox in the snow, 35mm"},
      {"Description",
       "caf\xc3\xa9 au lait \xe2\x98\x95 with \xe6\xbc\xa2\xe5\xad\x97"},  // UTF-8: stored as iTXt
      {"parameters", "steps: 4\nseed: 42\nmodel: black-forest-labs/FLUX.1-schnell"},
      {"empty", ""},
  };
  io::write_png(path, noise(8 * 8 * 3, 1), 8, 8, 3, text);
  EXPECT_EQ(io::read_png(path).text, text);
  const std::string bytes = testing::read_bytes(path);
  EXPECT_NE(bytes.find("tEXtprompt"), std::string::npos);
  EXPECT_NE(bytes.find("iTXtDescription"), std::string::npos);
  // The text precedes the pixel data.
  EXPECT_LT(bytes.find("tEXtprompt"), bytes.find("IDAT"));
}

// encode_png (an image served over HTTP) gives the bytes of the file write_png writes, text chunks included.
TEST(Png, EncodesInMemoryTheBytesOfTheFile) {
  const std::string path = temp_dir("png_memory") + "/gen.png";
  const std::map<std::string, std::string> text = {{"prompt", "a red fox"}, {"Description", "caf\xc3\xa9"}};
  const auto pixels = noise(13 * 7 * 3, 7);
  io::write_png(path, pixels, 13, 7, 3, text);
  const std::string bytes = io::encode_png(pixels.data(), 13, 7, 3, text);
  EXPECT_EQ(bytes, testing::read_bytes(path));
  Image image{.width = 13, .height = 7, .channels = 3, .pixels = pixels, .metadata = text};
  EXPECT_EQ(image.encode_png(), bytes);
  image.pixels.pop_back();
  EXPECT_KILN_ERROR(image.encode_png(), "Image::encode_png", "do not fill 13x7x3");
  EXPECT_KILN_ERROR(io::encode_png(pixels.data(), 13, 7, 5), "encode_png", "channels, got 5");
}

TEST(Png, RejectsBadArguments) {
  const std::string dir = temp_dir("png_bad_args");
  const auto px = noise(48, 2);
  EXPECT_KILN_ERROR(io::write_png(dir + "/a.png", px, 4, 4, 5), "write_png", "a.png", "channels, got 5");
  EXPECT_KILN_ERROR(io::write_png(dir + "/a.png", px, 0, 4, 3), "write_png", "0x4");
  EXPECT_KILN_ERROR(io::write_png(dir + "/a.png", px, 4, 4, 3, {{"", "v"}}), "text key", "1 to 79");
  EXPECT_KILN_ERROR(io::write_png(dir + "/a.png", px, 4, 4, 3, {{std::string(80, 'k'), "v"}}), "1 to 79");
  EXPECT_KILN_ERROR(io::write_png(dir + "/a.png", px, 4, 4, 3, {{" lead", "v"}}), "space");
  EXPECT_KILN_ERROR(io::write_png(dir + "/a.png", px, 4, 4, 3, {{"k\xc3\xa9", "v"}}), "printable ASCII");
  EXPECT_KILN_ERROR(io::write_png(dir + "/a.png", px, 4, 4, 3, {{"k", std::string("a\0b", 3)}}), "NUL");
  EXPECT_EQ(entries_in(dir), 0u);
}

TEST(Png, FailedWritesLeaveNoFile) {
  const std::string dir = temp_dir("png_fail");
  const auto px = noise(16 * 16 * 3, 3);
  fs::create_directory(dir + "/taken");
  EXPECT_KILN_ERROR(io::write_png(dir + "/taken", px, 16, 16, 3), "taken", "directory");
  EXPECT_KILN_ERROR(io::write_png(dir + "/no/such/dir/x.png", px, 16, 16, 3), "x.png", "does not exist");
  EXPECT_EQ(entries_in(dir), 1u);  // only "taken"

  // A write that fails halfway (the file size limit is hit inside libpng's output) leaves nothing behind,
  // and an existing image at the destination survives untouched.
  const std::string path = dir + "/image.png";
  io::write_png(path, px, 16, 16, 3);
  const std::string before = testing::read_bytes(path);
  const auto big = noise(256 * 256 * 3, 4);  // incompressible: ~196 KB of PNG
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);  // get EFBIG from write() instead of a signal
  struct rlimit small = old;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string message = testing::error_message([&] { io::write_png(path, big, 256, 256, 3); });
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(testing::has_all(message, {"write_png", path, "write failed"}));
  EXPECT_EQ(testing::read_bytes(path), before);
  EXPECT_EQ(entries_in(dir), 2u);  // "taken" and the old image.png: no temporary file left
  EXPECT_EQ(io::read_png(path).pixels, px);
}

TEST(Png, ReadErrors) {
  const std::string dir = temp_dir("png_read");
  EXPECT_KILN_ERROR(io::read_png(dir + "/none.png"), "read_png", "none.png", "cannot open");
  testing::write_bytes(dir + "/text.png", "hello, not an image");
  EXPECT_KILN_ERROR(io::read_png(dir + "/text.png"), "text.png", "not a PNG file");
  // A truncated PNG is reported by libpng, not read past its end.
  io::write_png(dir + "/good.png", noise(32 * 32 * 4, 5), 32, 32, 4);
  const std::string good = testing::read_bytes(dir + "/good.png");
  for (size_t cut : {size_t{20}, size_t{60}, good.size() / 2, good.size() - 13}) {
    SCOPED_TRACE(cut);
    testing::write_bytes(dir + "/cut.png", good.substr(0, cut));
    EXPECT_KILN_ERROR(io::read_png(dir + "/cut.png"), "read_png", "cut.png");
  }
  // A corrupt byte in the pixel data fails the CRC check.
  std::string corrupt = good;
  corrupt[good.find("IDAT") + 40] ^= 0x55;
  testing::write_bytes(dir + "/crc.png", corrupt);
  EXPECT_KILN_ERROR(io::read_png(dir + "/crc.png"), "crc.png");
}

TEST(Png, ReadsFilesFromOtherWriters) {
  // A 2x1 palette image with transparency (red opaque, blue half transparent), built by hand with zlib the
  // way other tools write them: it expands to RGBA.
  const std::string dir = temp_dir("png_palette");
  const unsigned char palette_png[] = {
      0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52, 0x00,
      0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x01, 0x08, 0x03, 0x00, 0x00, 0x00, 0xc3, 0xfc, 0x8f, 0xb8, 0x00,
      0x00, 0x00, 0x06, 0x50, 0x4c, 0x54, 0x45, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0x6c, 0xa1, 0xfd, 0x8e,
      0x00, 0x00, 0x00, 0x02, 0x74, 0x52, 0x4e, 0x53, 0xff, 0x80, 0x08, 0x0f, 0xb3, 0x6a, 0x00, 0x00, 0x00,
      0x0b, 0x49, 0x44, 0x41, 0x54, 0x78, 0xda, 0x63, 0x60, 0x60, 0x04, 0x00, 0x00, 0x04, 0x00, 0x02, 0x2c,
      0xde, 0x48, 0xad, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82};
  testing::write_bytes(dir + "/p.png",
                       std::string(reinterpret_cast<const char*>(palette_png), sizeof palette_png));
  const auto img = io::read_png(dir + "/p.png");
  EXPECT_EQ(img.channels, 4);
  EXPECT_EQ(img.pixels, (std::vector<uint8_t>{255, 0, 0, 255, 0, 0, 255, 128}));
}

}  // namespace
}  // namespace kiln
