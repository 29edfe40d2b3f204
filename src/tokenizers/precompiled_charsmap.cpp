#include "tokenizers/precompiled_charsmap.h"

#include <cstring>

#include "kiln/core/error.h"
#include "tokenizers/unicode.h"

namespace kiln::tokenizers {
namespace {

// darts-clone unit layout.
uint32_t unit_label(uint32_t u) {
  return u & (0x80000000u | 0xFFu);
}
bool unit_has_leaf(uint32_t u) {
  return (u >> 8) & 1u;
}
uint32_t unit_value(uint32_t u) {
  return u & 0x7FFFFFFFu;
}
uint32_t unit_offset(uint32_t u) {
  return (u >> 10) << ((u & 0x200u) >> 6);
}

}  // namespace

PrecompiledCharsmap::PrecompiledCharsmap(std::string_view blob, const std::string& source) {
  KILN_CHECK(blob.size() >= 4, source << ": precompiled_charsmap is " << blob.size()
                                      << " bytes, expected at least a 4-byte trie size");
  uint32_t trie_bytes = 0;
  std::memcpy(&trie_bytes, blob.data(), 4);
  KILN_CHECK(trie_bytes % 4 == 0 && trie_bytes >= 4 && trie_bytes <= blob.size() - 4,
             source << ": precompiled_charsmap declares a trie of " << trie_bytes << " bytes but holds "
                    << blob.size() - 4 << " bytes after the size field (expected a positive multiple of 4)");
  units_.resize(trie_bytes / 4);
  std::memcpy(units_.data(), blob.data() + 4, trie_bytes);
  pool_.assign(blob.substr(4 + trie_bytes));
}

std::optional<std::string_view> PrecompiledCharsmap::transform(std::string_view chunk) const {
  size_t pos = unit_offset(units_[0]);
  for (char ch : chunk) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == 0) break;
    pos ^= c;
    if (pos >= units_.size()) return std::nullopt;
    const uint32_t u = units_[pos];
    if (unit_label(u) != c) return std::nullopt;
    pos ^= unit_offset(u);
    if (pos >= units_.size()) return std::nullopt;
    if (unit_has_leaf(u)) {
      const uint32_t value = unit_value(units_[pos]);
      if (value >= pool_.size()) return std::nullopt;
      const size_t end = pool_.find('\0', value);
      return std::string_view(pool_).substr(value, (end == std::string::npos ? pool_.size() : end) - value);
    }
  }
  return std::nullopt;
}

NormalizedText PrecompiledCharsmap::normalize(const NormalizedText& in) const {
  const std::string& text = in.text;
  // Byte offsets of the code points, so that grapheme boundaries (in code points) map back to bytes.
  std::vector<size_t> byte_at;
  std::u32string chars;
  for (size_t pos = 0; pos < text.size();) {
    byte_at.push_back(pos);
    chars.push_back(unicode::next_code_point(text, pos, "Precompiled normalizer"));
  }
  byte_at.push_back(text.size());

  NormalizedText out;
  out.text.reserve(text.size());
  out.origin.reserve(text.size());
  const std::vector<size_t> bounds = unicode::grapheme_boundaries(chars);
  for (size_t g = 0; g + 1 < bounds.size(); ++g) {
    const size_t first = byte_at[bounds[g]], last = byte_at[bounds[g + 1]];
    const std::string_view grapheme(text.data() + first, last - first);
    // HF tokenizers replaces a whole short grapheme by its first trie match, even a match on a prefix of it.
    if (grapheme.size() < 6) {
      if (auto norm = transform(grapheme)) {
        out.append(*norm, in.origin[first]);
        continue;
      }
    }
    for (size_t c = bounds[g]; c < bounds[g + 1]; ++c) {
      const std::string_view part(text.data() + byte_at[c], byte_at[c + 1] - byte_at[c]);
      if (auto norm = transform(part)) {
        out.append(*norm, in.origin[byte_at[c]]);
      } else {
        out.append(part, in.origin[byte_at[c]]);
      }
    }
  }
  return out;
}

}  // namespace kiln::tokenizers
