#include "kiln/io/png.h"

#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

#include "io/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/core/limits.h"

namespace kiln::io {

namespace {

// libpng reports errors by calling back and longjmp-ing to a setjmp point. The functions that hold a setjmp
// point (encode, read_header, read_pixels) keep only trivially destructible locals, so a jump skips no C++
// destructor; everything that owns memory lives in their callers.
struct PngError {
  char message[256] = "unknown libpng error";
};

void on_error(png_structp png, png_const_charp msg) {
  auto* err = static_cast<PngError*>(png_get_error_ptr(png));
  std::snprintf(err->message, sizeof err->message, "%s", msg);
  png_longjmp(png, 1);
}
void on_warning(png_structp, png_const_charp) {}  // benign (e.g. a known-incorrect sRGB profile)

// Where the encoded bytes go: a file being written atomically, or memory.
struct WriteSink {
  AtomicFile* file;
  std::string* memory;
  PngError* error;
};

void write_to_sink(png_structp png, png_bytep data, size_t size) {
  auto* sink = static_cast<WriteSink*>(png_get_io_ptr(png));
  bool failed = false;
  try {
    if (sink->file != nullptr)
      sink->file->write(data, size);
    else
      sink->memory->append(reinterpret_cast<const char*>(data), size);
  } catch (const std::exception& e) {
    std::snprintf(sink->error->message, sizeof sink->error->message, "%s", e.what());
    failed = true;
  }
  // Outside the catch block: the exception is gone before libpng jumps away.
  if (failed) png_longjmp(png, 1);
}
void flush_sink(png_structp) {}

bool encode(png_structp png, png_infop info, WriteSink* sink, const uint8_t* pixels, int width, int height,
            int channels, png_text* texts, int text_count) {
  if (setjmp(png_jmpbuf(png))) return false;
  static constexpr int kColorTypes[] = {PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                                        PNG_COLOR_TYPE_RGB_ALPHA};
  png_set_write_fn(png, sink, write_to_sink, flush_sink);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8,
               kColorTypes[channels - 1], PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  // Text before the pixels, where readers that stop early (and people running `head`) still find it.
  if (text_count > 0) png_set_text(png, info, texts, text_count);
  png_write_info(png, info);
  const size_t row_bytes = static_cast<size_t>(width) * static_cast<size_t>(channels);
  for (int y = 0; y < height; ++y)
    png_write_row(png, const_cast<png_bytep>(pixels + static_cast<size_t>(y) * row_bytes));
  png_write_end(png, info);
  return true;
}

void check_text_key(const std::string& path, const std::string& key) {
  KILN_CHECK(!key.empty() && key.size() <= 79,
             path << ": PNG text key '" << key << "' must be 1 to 79 characters long, not " << key.size());
  for (char c : key)
    KILN_CHECK(c >= 32 && c <= 126, path << ": PNG text key '" << key << "' must be printable ASCII");
  KILN_CHECK(
      key.front() != ' ' && key.back() != ' ' && key.find("  ") == std::string::npos,
      path << ": PNG text key '" << key << "' may not start or end with a space, or hold two in a row");
}

bool is_plain_text(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

struct ReadState {
  png_uint_32 width = 0, height = 0;
  int channels = 0;
  size_t row_bytes = 0;
};

bool read_header(png_structp png, png_infop info, FILE* fp, ReadState* st) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_init_io(png, fp);
  png_read_info(png, info);
  // Everything becomes 8-bit gray, gray+alpha, RGB or RGBA.
  png_set_expand(png);    // palette -> RGB, gray below 8 bits -> 8 bits, tRNS -> alpha
  png_set_strip_16(png);  // 16 -> 8 bits per channel
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  st->width = png_get_image_width(png, info);
  st->height = png_get_image_height(png, info);
  st->channels = png_get_channels(png, info);
  st->row_bytes = png_get_rowbytes(png, info);
  return true;
}

bool read_pixels(png_structp png, png_infop info, png_infop end_info, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  png_read_end(png, end_info);
  return true;
}

void collect_text(png_structp png, png_infop info, std::map<std::string, std::string>& out) {
  png_textp texts = nullptr;
  const int n = png_get_text(png, info, &texts, nullptr);
  for (int i = 0; i < n; ++i) {
    const size_t len = texts[i].compression > 0 ? texts[i].itxt_length : texts[i].text_length;
    out[texts[i].key] = std::string(texts[i].text ? texts[i].text : "", texts[i].text ? len : 0);
  }
}

// Checks the image and its text and encodes it into `sink`; `what` names the destination in errors.
void encode_checked(const std::string& what, WriteSink& sink, const uint8_t* pixels, int width, int height,
                    int channels, const std::map<std::string, std::string>& text) {
  KILN_CHECK(channels >= 1 && channels <= 4,
             what << ": expected 1 (gray), 2 (gray+alpha), 3 (RGB) or 4 (RGBA) channels, got " << channels);
  KILN_CHECK(width > 0 && height > 0,
             what << ": image size " << width << "x" << height << " must be positive");
  KILN_CHECK(pixels != nullptr, what << ": no pixel data");
  std::vector<png_text> texts;
  texts.reserve(text.size());
  for (const auto& [key, value] : text) {
    check_text_key(what, key);
    KILN_CHECK(value.find('\0') == std::string::npos,
               what << ": PNG text '" << key << "' contains a NUL byte");
    png_text t{};
    t.key = const_cast<char*>(key.c_str());
    t.text = const_cast<char*>(value.c_str());
    if (is_plain_text(value)) {
      t.compression = PNG_TEXT_COMPRESSION_NONE;  // tEXt
      t.text_length = value.size();
    } else {
      t.compression = PNG_ITXT_COMPRESSION_NONE;  // iTXt: UTF-8
      t.itxt_length = value.size();
      t.lang = const_cast<char*>("");
      t.lang_key = const_cast<char*>("");
    }
    texts.push_back(t);
  }

  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, sink.error, on_error, on_warning);
  KILN_CHECK(png != nullptr, what << ": cannot initialise libpng");
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_write_struct(&png, nullptr);
    KILN_FAIL(what << ": cannot initialise libpng");
  }
  const bool ok =
      encode(png, info, &sink, pixels, width, height, channels, texts.data(), static_cast<int>(texts.size()));
  png_destroy_write_struct(&png, &info);
  KILN_CHECK(ok, what << ": " << sink.error->message);
}

}  // namespace

void write_png(const std::string& path, const uint8_t* pixels, int width, int height, int channels,
               const std::map<std::string, std::string>& text) {
  AtomicFile file(path);  // removes its temporary file unless committed
  PngError error;
  WriteSink sink{&file, nullptr, &error};
  encode_checked("write_png: " + path, sink, pixels, width, height, channels, text);
  file.commit();
}

std::string encode_png(const uint8_t* pixels, int width, int height, int channels,
                       const std::map<std::string, std::string>& text) {
  std::string bytes;
  PngError error;
  WriteSink sink{nullptr, &bytes, &error};
  encode_checked("encode_png", sink, pixels, width, height, channels, text);
  return bytes;
}

// libpng allocates a chunk's declared length before reading its bytes (its own limit is only a warning on
// read): a text chunk claiming 1.8 GB in a 377-byte file was an allocation of 1.8 GB (found by fuzz_png). So
// the chunk lengths are walked first: none may run past the end of the file.
void check_chunk_lengths(FILE* fp, const std::string& path) {
  KILN_CHECK(std::fseek(fp, 0, SEEK_END) == 0,
             "read_png: " << path << ": cannot seek: " << std::strerror(errno));
  const long size = std::ftell(fp);
  long at = 8;  // after the signature
  while (at + 8 <= size) {
    unsigned char header[8];
    KILN_CHECK(std::fseek(fp, at, SEEK_SET) == 0 && std::fread(header, 1, 8, fp) == 8,
               "read_png: " << path << ": cannot read the chunk at byte " << at);
    const uint32_t length = uint32_t{header[0]} << 24 | uint32_t{header[1]} << 16 | uint32_t{header[2]} << 8 |
                            uint32_t{header[3]};
    const std::string type(reinterpret_cast<const char*>(header + 4), 4);
    const long left = size - at - 12;  // after this chunk's length, type and CRC
    KILN_CHECK(static_cast<long>(length) <= left,
               "read_png: " << path << ": chunk '" << type << "' at byte " << at << " declares " << length
                            << " bytes but the file has " << std::max(left, 0L)
                            << " left (a truncated or corrupt PNG)");
    at += 12 + static_cast<long>(length);
    if (type == "IEND") break;
  }
  std::rewind(fp);
}

namespace {

// Reads the PNG `fp` holds (its signature first), named `name` in errors; at most `max_pixels` pixels.
PngImage read_png_from(FILE* fp, const std::string& name, int64_t max_pixels) {
  png_byte signature[8] = {};
  const size_t got = std::fread(signature, 1, 8, fp);
  KILN_CHECK(got == 8 && png_sig_cmp(signature, 0, 8) == 0, "read_png: " << name << ": not a PNG file");
  check_chunk_lengths(fp, name);

  PngError error;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &error, on_error, on_warning);
  KILN_CHECK(png != nullptr, "read_png: " << name << ": cannot initialise libpng");
  png_infop info = png_create_info_struct(png);
  png_infop end_info = png_create_info_struct(png);
  struct Cleanup {
    png_structp* png;
    png_infop* info;
    png_infop* end_info;
    ~Cleanup() { png_destroy_read_struct(png, info, end_info); }
  } cleanup{&png, &info, &end_info};
  KILN_CHECK(info != nullptr && end_info != nullptr, "read_png: " << name << ": cannot initialise libpng");

  ReadState st;
  KILN_CHECK(read_header(png, info, fp, &st), "read_png: " << name << ": " << error.message);
  KILN_CHECK(st.channels >= 1 && st.channels <= 4 && st.row_bytes == size_t{st.width} * st.channels,
             "read_png: " << name << ": unexpected layout after conversion (" << st.channels << " channels)");
  // The header's size alone decides the allocation below: an absurd one is refused before it.
  KILN_CHECK(st.width <= limits::kMaxImageSide && st.height <= limits::kMaxImageSide,
             "read_png: " << name << ": " << st.width << "x" << st.height
                          << " pixels exceeds the maximum side " << limits::kMaxImageSide);
  KILN_CHECK(int64_t{st.width} * int64_t{st.height} <= max_pixels,
             "read_png: " << name << ": " << st.width << "x" << st.height << " pixels is more than the "
                          << max_pixels << " this reader takes");
  PngImage image;
  image.width = static_cast<int>(st.width);
  image.height = static_cast<int>(st.height);
  image.channels = st.channels;
  image.pixels.resize(st.row_bytes * st.height);
  std::vector<png_bytep> rows(st.height);
  for (png_uint_32 y = 0; y < st.height; ++y) rows[y] = image.pixels.data() + y * st.row_bytes;
  KILN_CHECK(read_pixels(png, info, end_info, rows.data()), "read_png: " << name << ": " << error.message);
  collect_text(png, info, image.text);
  collect_text(png, end_info, image.text);
  return image;
}

}  // namespace

PngImage read_png(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> fp(std::fopen(path.c_str(), "rb"), std::fclose);
  KILN_CHECK(fp != nullptr, "read_png: " << path << ": cannot open: " << std::strerror(errno));
  return read_png_from(fp.get(), path, limits::kMaxImageSide * limits::kMaxImageSide);
}

PngImage decode_png(std::string_view bytes, const std::string& name, int64_t max_pixels) {
  KILN_CHECK(!bytes.empty(), "read_png: " << name << ": empty (expected a PNG file)");
  // A stream over the bytes, so that files and memory share one reader (fmemopen reads, never writes, here).
  std::unique_ptr<FILE, int (*)(FILE*)> fp(fmemopen(const_cast<char*>(bytes.data()), bytes.size(), "rb"),
                                           std::fclose);
  KILN_CHECK(fp != nullptr, "read_png: " << name << ": cannot read from memory: " << std::strerror(errno));
  return read_png_from(fp.get(), name, max_pixels);
}

}  // namespace kiln::io
