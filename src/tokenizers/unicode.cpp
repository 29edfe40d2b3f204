#include "tokenizers/unicode.h"

#include <algorithm>
#include <array>

#include "kiln/core/error.h"

namespace kiln::tokenizers::unicode {
namespace {

struct PropertyRange {
  uint32_t first;
  uint32_t props;
};
struct CodePointPair {
  uint32_t from;
  uint32_t to;
};
struct CodePointTriple {
  uint32_t a;
  uint32_t b;
  uint32_t c;
};

#include "tokenizers/unicode_tables.inc"

constexpr char32_t kMaxCodePoint = 0x10FFFF;

// Hangul syllables are composed and decomposed arithmetically (Unicode chapter 3.12), not through tables.
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint32_t packed_properties(char32_t c) {
  if (c > kMaxCodePoint) return 0;
  auto it = std::upper_bound(std::begin(kPropertyRanges), std::end(kPropertyRanges), static_cast<uint32_t>(c),
                             [](uint32_t v, const PropertyRange& r) { return v < r.first; });
  return (it - 1)->props;
}

uint8_t combining_class(char32_t c) {
  return static_cast<uint8_t>(packed_properties(c) >> 10);
}

const CodePointTriple* find_decomposition(char32_t c) {
  auto it = std::lower_bound(std::begin(kDecomposition), std::end(kDecomposition), static_cast<uint32_t>(c),
                             [](const CodePointTriple& t, uint32_t v) { return t.a < v; });
  return (it != std::end(kDecomposition) && it->a == c) ? it : nullptr;
}

void decompose_into(std::u32string& out, char32_t c) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (const CodePointTriple* d = find_decomposition(c)) {
    decompose_into(out, d->b);
    if (d->c != 0) decompose_into(out, d->c);
    return;
  }
  out.push_back(c);
}

// Returns the primary composite of (a, b), or 0 when there is none.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  auto it =
      std::lower_bound(std::begin(kComposition), std::end(kComposition), std::pair<uint32_t, uint32_t>(a, b),
                       [](const CodePointTriple& t, const std::pair<uint32_t, uint32_t>& v) {
                         return t.a < v.first || (t.a == v.first && t.b < v.second);
                       });
  return (it != std::end(kComposition) && it->a == a && it->b == b) ? it->c : 0;
}

}  // namespace

CharProperties properties(char32_t c) {
  const uint32_t p = packed_properties(c);
  CharProperties r;
  r.letter = (p & 3) == 1;
  r.number = (p & 3) == 2;
  r.white_space = (p >> 2) & 1;
  r.grapheme_break = static_cast<GraphemeBreak>((p >> 3) & 15);
  r.extended_pictographic = (p >> 7) & 1;
  r.indic_conjunct_break = static_cast<IndicConjunctBreak>((p >> 8) & 3);
  r.combining_class = static_cast<uint8_t>(p >> 10);
  return r;
}

GeneralCategory general_category(char32_t c) {
  if (c > kMaxCodePoint) return GeneralCategory::Cn;
  auto it =
      std::upper_bound(std::begin(kGeneralCategory), std::end(kGeneralCategory), static_cast<uint32_t>(c),
                       [](uint32_t v, const PropertyRange& r) { return v < r.first; });
  return static_cast<GeneralCategory>((it - 1)->props);
}

char32_t simple_case_fold(char32_t c) {
  auto it = std::lower_bound(std::begin(kCaseFold), std::end(kCaseFold), static_cast<uint32_t>(c),
                             [](const CodePointPair& p, uint32_t v) { return p.from < v; });
  return (it != std::end(kCaseFold) && it->from == c) ? static_cast<char32_t>(it->to) : c;
}

size_t utf8_length(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return 4;
  return 1;
}

char32_t next_code_point(std::string_view text, size_t& pos, const char* who) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  const size_t len = utf8_length(b0);
  auto fail = [&]() {
    KILN_FAIL(who << ": invalid UTF-8 at byte " << pos << " (lead byte 0x" << std::hex << int{b0} << ")");
  };
  if (len == 1) {
    if (b0 >= 0x80) fail();
    ++pos;
    return b0;
  }
  if (pos + len > text.size()) fail();
  char32_t c = b0 & (0x7F >> len);
  for (size_t i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(text[pos + i]);
    if ((b & 0xC0) != 0x80) fail();
    c = (c << 6) | (b & 0x3F);
  }
  static constexpr std::array<char32_t, 5> kMinForLength{0, 0, 0x80, 0x800, 0x10000};
  if (c < kMinForLength[len] || c > kMaxCodePoint || (c >= 0xD800 && c <= 0xDFFF)) fail();
  pos += len;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::u32string decode_utf8(std::string_view text, const char* who) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) out.push_back(next_code_point(text, pos, who));
  return out;
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(out, c);
  return out;
}

void append_lowercase(std::u32string& out, char32_t c) {
  auto special =
      std::lower_bound(std::begin(kLowercaseSpecial), std::end(kLowercaseSpecial), static_cast<uint32_t>(c),
                       [](const CodePointTriple& t, uint32_t v) { return t.a < v; });
  if (special != std::end(kLowercaseSpecial) && special->a == c) {
    out.push_back(special->b);
    out.push_back(special->c);
    return;
  }
  auto it = std::lower_bound(std::begin(kLowercase), std::end(kLowercase), static_cast<uint32_t>(c),
                             [](const CodePointPair& p, uint32_t v) { return p.from < v; });
  out.push_back((it != std::end(kLowercase) && it->from == c) ? it->to : c);
}

std::u32string nfd(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text) decompose_into(out, c);
  // Canonical ordering: stable-sort each run of non-starters by combining class.
  for (size_t i = 0; i < out.size();) {
    if (combining_class(out[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < out.size() && combining_class(out[j]) != 0) ++j;
    std::stable_sort(out.begin() + static_cast<std::ptrdiff_t>(i),
                     out.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  return out;
}

std::u32string nfc(std::u32string_view text) {
  const std::u32string decomposed = nfd(text);
  std::u32string out;
  out.reserve(decomposed.size());
  size_t starter = std::u32string::npos;
  // Combining class of the last character kept after the current starter; -1 while none follows it.
  int last_class = -1;
  for (char32_t c : decomposed) {
    const int cls = combining_class(c);
    // c is blocked from the starter when a character between them is a starter or has a class >= c's.
    const bool reachable =
        starter != std::u32string::npos && (last_class == -1 || (last_class != 0 && last_class < cls));
    if (reachable) {
      if (char32_t composite = compose_pair(out[starter], c)) {
        out[starter] = composite;
        continue;
      }
    }
    if (cls == 0) {
      starter = out.size();
      last_class = -1;
    } else {
      last_class = cls;
    }
    out.push_back(c);
  }
  return out;
}

std::vector<size_t> grapheme_boundaries(std::u32string_view text) {
  using G = GraphemeBreak;
  using I = IndicConjunctBreak;
  std::vector<size_t> bounds;
  if (text.empty()) {
    bounds.push_back(0);
    return bounds;
  }
  bounds.push_back(0);
  CharProperties prev = properties(text[0]);
  // Running state for the rules that look further back than one character.
  int regional_run = prev.grapheme_break == G::RegionalIndicator ? 1 : 0;  // GB12/13
  bool pictographic_extend = prev.extended_pictographic;                   // GB11: ExtPict Extend*
  bool pictographic_zwj = false;                                           // GB11: ExtPict Extend* ZWJ
  int conjunct = prev.indic_conjunct_break == I::Consonant ? 1 : 0;  // GB9c: 1 consonant seen, 2 + linker
  for (size_t i = 1; i < text.size(); ++i) {
    const CharProperties cur = properties(text[i]);
    const G a = prev.grapheme_break, b = cur.grapheme_break;
    bool join;
    if (a == G::CR && b == G::LF) {
      join = true;  // GB3
    } else if (a == G::Control || a == G::CR || a == G::LF || b == G::Control || b == G::CR || b == G::LF) {
      join = false;  // GB4, GB5
    } else if (a == G::L && (b == G::L || b == G::V || b == G::LV || b == G::LVT)) {
      join = true;  // GB6
    } else if ((a == G::LV || a == G::V) && (b == G::V || b == G::T)) {
      join = true;  // GB7
    } else if ((a == G::LVT || a == G::T) && b == G::T) {
      join = true;  // GB8
    } else if (b == G::Extend || b == G::ZWJ || b == G::SpacingMark || a == G::Prepend) {
      join = true;  // GB9, GB9a, GB9b
    } else if (cur.indic_conjunct_break == I::Consonant && conjunct == 2) {
      join = true;  // GB9c
    } else if (a == G::ZWJ && cur.extended_pictographic && pictographic_zwj) {
      join = true;  // GB11
    } else if (a == G::RegionalIndicator && b == G::RegionalIndicator) {
      join = regional_run % 2 == 1;  // GB12, GB13
    } else {
      join = false;  // GB999
    }
    if (!join) bounds.push_back(i);

    regional_run = b == G::RegionalIndicator ? regional_run + 1 : 0;
    if (cur.extended_pictographic) {
      pictographic_extend = true;
      pictographic_zwj = false;
    } else if (b == G::Extend && pictographic_extend) {
      pictographic_zwj = false;
    } else if (b == G::ZWJ && pictographic_extend) {
      pictographic_extend = false;
      pictographic_zwj = true;
    } else {
      pictographic_extend = false;
      pictographic_zwj = false;
    }
    switch (cur.indic_conjunct_break) {
      case I::Consonant:
        conjunct = 1;
        break;
      case I::Linker:
        conjunct = conjunct ? 2 : 0;
        break;
      case I::Extend:
        break;
      case I::None:
        conjunct = 0;
        break;
    }
    prev = cur;
  }
  bounds.push_back(text.size());
  return bounds;
}

}  // namespace kiln::tokenizers::unicode
