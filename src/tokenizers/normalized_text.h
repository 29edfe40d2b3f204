// Text moving through a tokenizer's normalisers, with the byte offset in the caller's original string that
// each byte came from. The offsets answer one question the pipeline asks: does a piece start at the very
// beginning of the original text (Metaspace's prepend_scheme "first")?
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tokenizers {

struct NormalizedText {
  std::string text;
  std::vector<size_t> origin;  // origin[i]: original byte offset of text[i]

  NormalizedText() = default;
  NormalizedText(std::string t, size_t start) : text(std::move(t)), origin(text.size()) {
    for (size_t i = 0; i < text.size(); ++i) origin[i] = start + i;
  }
  // Appends bytes that all stem from original offset `from`.
  void append(std::string_view bytes, size_t from) {
    text.append(bytes);
    origin.insert(origin.end(), bytes.size(), from);
  }
  // Appends src.text[pos, pos + len) with its origins.
  void append_from(const NormalizedText& src, size_t pos, size_t len) {
    text.append(src.text, pos, len);
    origin.insert(origin.end(), src.origin.begin() + static_cast<std::ptrdiff_t>(pos),
                  src.origin.begin() + static_cast<std::ptrdiff_t>(pos + len));
  }
  NormalizedText substr(size_t pos, size_t len) const {
    NormalizedText r;
    r.text = text.substr(pos, len);
    r.origin.assign(origin.begin() + static_cast<std::ptrdiff_t>(pos),
                    origin.begin() + static_cast<std::ptrdiff_t>(pos + r.text.size()));
    return r;
  }
  bool starts_at_origin() const { return !origin.empty() && origin.front() == 0; }
};

}  // namespace kiln::tokenizers
