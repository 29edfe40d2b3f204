#include "tokenizers/byte_level.h"

#include <array>

#include "tokenizers/unicode.h"

namespace kiln::tokenizers {
namespace {

std::array<std::string, 256> build_table() {
  std::array<std::string, 256> table;
  char32_t next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    unicode::append_utf8(table[static_cast<size_t>(b)], printable ? static_cast<char32_t>(b) : next_extra++);
  }
  return table;
}

}  // namespace

std::string byte_level_encode(std::string_view text) {
  static const std::array<std::string, 256> table = build_table();
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) out += table[static_cast<unsigned char>(c)];
  return out;
}

}  // namespace kiln::tokenizers
