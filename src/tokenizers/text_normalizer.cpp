#include "tokenizers/text_normalizer.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "kiln/core/error.h"
#include "tokenizers/base64.h"
#include "tokenizers/unicode.h"

namespace kiln::tokenizers {

// ---- SimplePattern

SimplePattern SimplePattern::literal(std::string text) {
  SimplePattern p;
  p.literal_ = std::move(text);
  return p;
}

SimplePattern SimplePattern::regex(std::string_view pattern, const std::string& source) {
  SimplePattern p;
  p.is_regex_ = true;
  auto unsupported = [&]() {
    KILN_FAIL(source << ": unsupported Replace regex \"" << pattern
                     << "\" (supported: one character or \\s, optionally followed by +, {n}, {n,} or {n,m})");
  };
  size_t pos = 0;
  if (pattern.empty()) unsupported();
  if (pattern[0] == '\\') {
    if (pattern.size() < 2) unsupported();
    if (pattern[1] == 's') {
      p.atom_is_space_class_ = true;
    } else if (std::string_view(".^$|?*+()[]{}\\/-").find(pattern[1]) != std::string_view::npos) {
      p.atom_ = static_cast<unsigned char>(pattern[1]);
    } else {
      unsupported();
    }
    pos = 2;
  } else {
    if (std::string_view(".^$|?*+()[]{}").find(pattern[0]) != std::string_view::npos) unsupported();
    p.atom_ = unicode::next_code_point(pattern, pos, source.c_str());
  }
  if (pos < pattern.size()) {
    const std::string_view q = pattern.substr(pos);
    if (q == "+") {
      p.min_ = 1;
      p.max_ = std::numeric_limits<size_t>::max();
    } else if (q.size() >= 3 && q.front() == '{' && q.back() == '}') {
      const std::string_view body = q.substr(1, q.size() - 2);
      const size_t comma = body.find(',');
      auto number = [&](std::string_view s) {
        if (s.empty() || s.find_first_not_of("0123456789") != std::string_view::npos) unsupported();
        return static_cast<size_t>(std::stoul(std::string(s)));
      };
      if (comma == std::string_view::npos) {
        p.min_ = p.max_ = number(body);
      } else {
        p.min_ = number(body.substr(0, comma));
        p.max_ =
            comma + 1 == body.size() ? std::numeric_limits<size_t>::max() : number(body.substr(comma + 1));
      }
      if (p.min_ == 0 || p.max_ < p.min_) unsupported();
    } else {
      unsupported();
    }
  }
  return p;
}

bool SimplePattern::find(std::string_view text, size_t from, size_t& begin, size_t& end) const {
  if (!is_regex_) {
    if (literal_.empty()) return false;
    const size_t at = text.find(literal_, from);
    if (at == std::string_view::npos) return false;
    begin = at;
    end = at + literal_.size();
    return true;
  }
  auto matches = [&](char32_t c) { return atom_is_space_class_ ? unicode::is_white_space(c) : c == atom_; };
  for (size_t pos = from; pos < text.size();) {
    // Greedy run of the atom starting at pos; a run shorter than min_ cannot match anywhere inside it either.
    size_t run_end = pos, count = 0;
    while (run_end < text.size() && count < max_) {
      size_t next = run_end;
      if (!matches(unicode::next_code_point(text, next, "Replace normalizer"))) break;
      run_end = next;
      ++count;
    }
    if (count >= min_) {
      begin = pos;
      end = run_end;
      return true;
    }
    if (count == 0) {
      unicode::next_code_point(text, pos, "Replace normalizer");
    } else {
      pos = run_end;
    }
  }
  return false;
}

// ---- TextNormalizer

struct TextNormalizer::Step {
  enum class Kind { Nfc, Nfd, Lowercase, Strip, Replace, Precompiled } kind;
  bool strip_left = false, strip_right = false;
  SimplePattern pattern = SimplePattern::literal("");
  std::string content;
  std::shared_ptr<const PrecompiledCharsmap> charsmap;
};

namespace {

struct Decoded {
  std::u32string chars;
  std::vector<size_t> origin;  // origin of each char's first byte
};

Decoded decode(const NormalizedText& t, const char* who) {
  Decoded d;
  for (size_t pos = 0; pos < t.text.size();) {
    d.origin.push_back(t.origin[pos]);
    d.chars.push_back(unicode::next_code_point(t.text, pos, who));
  }
  return d;
}

NormalizedText encode(const std::u32string& chars, const std::vector<size_t>& origin) {
  NormalizedText out;
  std::string bytes;
  for (size_t i = 0; i < chars.size(); ++i) {
    bytes.clear();
    unicode::append_utf8(bytes, chars[i]);
    out.append(bytes, origin[i]);
  }
  return out;
}

NormalizedText apply_nf(const NormalizedText& in, bool compose) {
  const Decoded d = decode(in, compose ? "NFC normalizer" : "NFD normalizer");
  const std::u32string out = compose ? unicode::nfc(d.chars) : unicode::nfd(d.chars);
  // Normal forms only reorder and merge within combining sequences; map output characters to input ones by
  // position, which keeps the first character's origin (the one the pipeline asks about).
  std::vector<size_t> origin(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    origin[i] = d.origin.empty() ? 0 : d.origin[std::min(i, d.origin.size() - 1)];
  }
  return encode(out, origin);
}

NormalizedText apply_lowercase(const NormalizedText& in) {
  const Decoded d = decode(in, "Lowercase normalizer");
  std::u32string out;
  std::vector<size_t> origin;
  for (size_t i = 0; i < d.chars.size(); ++i) {
    const size_t before = out.size();
    unicode::append_lowercase(out, d.chars[i]);
    origin.insert(origin.end(), out.size() - before, d.origin[i]);
  }
  return encode(out, origin);
}

NormalizedText apply_strip(const NormalizedText& in, bool left, bool right) {
  const Decoded d = decode(in, "Strip normalizer");
  size_t b = 0, e = d.chars.size();
  if (left)
    while (b < e && unicode::is_white_space(d.chars[b])) ++b;
  if (right)
    while (e > b && unicode::is_white_space(d.chars[e - 1])) --e;
  return encode(d.chars.substr(b, e - b),
                std::vector<size_t>(d.origin.begin() + static_cast<std::ptrdiff_t>(b),
                                    d.origin.begin() + static_cast<std::ptrdiff_t>(e)));
}

NormalizedText apply_replace(const NormalizedText& in, const SimplePattern& pattern,
                             const std::string& content) {
  NormalizedText out;
  size_t pos = 0, begin = 0, end = 0;
  while (pattern.find(in.text, pos, begin, end)) {
    out.append_from(in, pos, begin - pos);
    out.append(content, in.origin[begin]);
    pos = end;
  }
  out.append_from(in, pos, in.text.size() - pos);
  return out;
}

}  // namespace

void TextNormalizer::add_nfc() {
  steps_.push_back(std::make_shared<Step>(Step{Step::Kind::Nfc}));
}

void TextNormalizer::add_lowercase() {
  steps_.push_back(std::make_shared<Step>(Step{Step::Kind::Lowercase}));
}

void TextNormalizer::add_replace(SimplePattern pattern, std::string content) {
  auto s = std::make_shared<Step>(Step{Step::Kind::Replace});
  s->pattern = std::move(pattern);
  s->content = std::move(content);
  steps_.push_back(std::move(s));
}

void TextNormalizer::add_precompiled(std::shared_ptr<const PrecompiledCharsmap> charsmap) {
  auto s = std::make_shared<Step>(Step{Step::Kind::Precompiled});
  s->charsmap = std::move(charsmap);
  steps_.push_back(std::move(s));
}

TextNormalizer TextNormalizer::from_json(const nlohmann::json& j, const std::string& source) {
  TextNormalizer n;
  if (!j.is_null()) n.add_from_json(j, source);
  return n;
}

void TextNormalizer::add_from_json(const nlohmann::json& j, const std::string& source) {
  KILN_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
             source << ": normalizer entry without a \"type\": " << j.dump().substr(0, 200));
  const std::string type = j["type"];
  if (type == "Sequence") {
    for (const auto& child : j.at("normalizers")) add_from_json(child, source);
  } else if (type == "NFC") {
    add_nfc();
  } else if (type == "NFD") {
    steps_.push_back(std::make_shared<Step>(Step{Step::Kind::Nfd}));
  } else if (type == "Lowercase") {
    add_lowercase();
  } else if (type == "Strip") {
    auto s = std::make_shared<Step>(Step{Step::Kind::Strip});
    s->strip_left = j.value("strip_left", true);
    s->strip_right = j.value("strip_right", true);
    steps_.push_back(std::move(s));
  } else if (type == "Replace") {
    const auto& pat = j.at("pattern");
    std::string content = j.at("content");
    if (pat.contains("String")) {
      add_replace(SimplePattern::literal(pat["String"].get<std::string>()), std::move(content));
    } else if (pat.contains("Regex")) {
      add_replace(SimplePattern::regex(pat["Regex"].get<std::string>(), source), std::move(content));
    } else {
      KILN_FAIL(source << ": Replace normalizer pattern must hold \"String\" or \"Regex\", got "
                       << pat.dump());
    }
  } else if (type == "Precompiled") {
    const auto& blob = j.at("precompiled_charsmap");
    // A null or empty charsmap normalises nothing (HF skips it too).
    if (!blob.is_null() && !blob.get<std::string>().empty()) {
      add_precompiled(
          std::make_shared<PrecompiledCharsmap>(base64_decode(blob.get<std::string>(), source), source));
    }
  } else {
    KILN_FAIL(source << ": unsupported normalizer type \"" << type
                     << "\" (supported: Sequence, NFC, NFD, Lowercase, Strip, Replace, Precompiled)");
  }
}

NormalizedText TextNormalizer::normalize(NormalizedText text) const {
  for (const auto& s : steps_) {
    switch (s->kind) {
      case Step::Kind::Nfc:
        text = apply_nf(text, true);
        break;
      case Step::Kind::Nfd:
        text = apply_nf(text, false);
        break;
      case Step::Kind::Lowercase:
        text = apply_lowercase(text);
        break;
      case Step::Kind::Strip:
        text = apply_strip(text, s->strip_left, s->strip_right);
        break;
      case Step::Kind::Replace:
        text = apply_replace(text, s->pattern, s->content);
        break;
      case Step::Kind::Precompiled:
        text = s->charsmap->normalize(text);
        break;
    }
  }
  return text;
}

}  // namespace kiln::tokenizers
