#include "tokenizers/added_vocabulary.h"

#include "tokenizers/unicode.h"

namespace kiln::tokenizers {
namespace {

// Code point ending just before byte `end` / starting at byte `begin` (text is valid UTF-8 here).
char32_t code_point_before(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return unicode::next_code_point(text, start, "added tokens");
}

char32_t code_point_at(std::string_view text, size_t begin) {
  return unicode::next_code_point(text, begin, "added tokens");
}

bool is_word_char(char32_t c) {
  return c == U'_' || unicode::is_letter(c) || unicode::is_number(c);
}

}  // namespace

void AddedVocabulary::add(AddedToken token) {
  for (auto& t : tokens_) {
    if (t.content == token.content) {
      t = std::move(token);
      return;
    }
  }
  tokens_.push_back(std::move(token));
}

const AddedToken* AddedVocabulary::find(std::string_view content) const {
  for (const auto& t : tokens_) {
    if (t.content == content) return &t;
  }
  return nullptr;
}

std::vector<TextPiece> AddedVocabulary::split_one(const NormalizedText& in,
                                                  const std::vector<Pattern>& patterns) const {
  std::vector<TextPiece> out;
  const std::string& s = in.text;
  size_t piece_start = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    // Leftmost-longest match, as the Aho-Corasick automaton HF builds (MatchKind::LeftmostLongest).
    const Pattern* best = nullptr;
    for (const auto& p : patterns) {
      if (!p.text.empty() && s.compare(pos, p.text.size(), p.text) == 0 &&
          (!best || p.text.size() > best->text.size())) {
        best = &p;
      }
    }
    if (!best) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + best->text.size();
    pos = stop;
    const AddedToken& tok = *best->token;
    if (tok.single_word) {
      const bool alone_left = start == 0 || !is_word_char(code_point_before(s, start));
      const bool alone_right = stop == s.size() || !is_word_char(code_point_at(s, stop));
      if (!alone_left || !alone_right) continue;
    }
    if (tok.lstrip) {
      while (start > piece_start && unicode::is_white_space(code_point_before(s, start))) {
        size_t b = start - 1;
        while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
        start = b;
      }
    }
    if (tok.rstrip) {
      while (stop < s.size()) {
        size_t next = stop;
        if (!unicode::is_white_space(unicode::next_code_point(s, next, "added tokens"))) break;
        stop = next;
      }
      pos = stop;
    }
    if (start > piece_start)
      out.push_back(TextPiece{in.substr(piece_start, start - piece_start), std::nullopt});
    out.push_back(TextPiece{in.substr(start, stop - start), tok.id});
    piece_start = stop;
  }
  if (piece_start < s.size())
    out.push_back(TextPiece{in.substr(piece_start, s.size() - piece_start), std::nullopt});
  return out;
}

std::vector<TextPiece> AddedVocabulary::split(std::string_view text, const TextNormalizer& normalizer) const {
  std::vector<Pattern> raw, normalized;
  for (const auto& t : tokens_) {
    if (t.normalized) {
      normalized.push_back(Pattern{normalizer.normalize(t.content), &t});
    } else {
      raw.push_back(Pattern{t.content, &t});
    }
  }
  // Validates the whole input once, so later stages can decode without failing half-way.
  unicode::decode_utf8(text, "tokenizer input");
  std::vector<TextPiece> out;
  for (auto& piece : split_one(NormalizedText(std::string(text), 0), raw)) {
    if (piece.token_id) {
      out.push_back(std::move(piece));
      continue;
    }
    const NormalizedText norm = normalizer.normalize(std::move(piece.text));
    for (auto& sub : split_one(norm, normalized)) {
      if (!sub.text.text.empty()) out.push_back(std::move(sub));
    }
  }
  return out;
}

}  // namespace kiln::tokenizers
