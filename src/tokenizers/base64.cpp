#include "tokenizers/base64.h"

#include <cstdint>

#include "kiln/core/error.h"

namespace kiln::tokenizers {

std::string base64_decode(std::string_view text, const std::string& source) {
  auto value = [&](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    KILN_FAIL(source << ": invalid base64 character 0x" << std::hex << int{static_cast<unsigned char>(c)});
  };
  KILN_CHECK(text.size() % 4 == 0, source << ": base64 text of length " << text.size()
                                          << " is not a multiple of 4 (truncated or corrupt)");
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const size_t pad = (text[i + 3] == '=') + (text[i + 2] == '=');
    KILN_CHECK((pad == 0 || i + 4 == text.size()) && !(text[i + 2] == '=' && text[i + 3] != '='),
               source << ": misplaced base64 padding at character " << i);
    const int a = value(text[i]), b = value(text[i + 1]);
    const int c = pad >= 2 ? 0 : value(text[i + 2]);
    const int d = pad >= 1 ? 0 : value(text[i + 3]);
    const auto v = static_cast<uint32_t>(a << 18) | (b << 12) | (c << 6) | d;
    out.push_back(static_cast<char>(v >> 16));
    if (pad < 2) out.push_back(static_cast<char>((v >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(v & 0xFF));
  }
  return out;
}

}  // namespace kiln::tokenizers
