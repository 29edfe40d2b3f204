#include "tokenizers/split_pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "kiln/core/error.h"
#include "tokenizers/byte_level.h"
#include "tokenizers/unicode.h"

namespace kiln::tokenizers {
namespace {

// GPT-2's split pattern, which ByteLevel applies when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Segment {
  size_t begin, end;  // code point indices
  bool is_match;
};

SplitPreTokenizer::Behavior parse_behavior(const std::string& name, const std::string& source) {
  using B = SplitPreTokenizer::Behavior;
  if (name == "Isolated") return B::Isolated;
  if (name == "Removed") return B::Removed;
  if (name == "MergedWithPrevious") return B::MergedWithPrevious;
  if (name == "MergedWithNext") return B::MergedWithNext;
  if (name == "Contiguous") return B::Contiguous;
  KILN_FAIL(source << ": Split behavior \"" << name
                   << "\" is unknown (expected Isolated, Removed, MergedWithPrevious, MergedWithNext or "
                      "Contiguous)");
}

// The pieces HF tokenizers' SplitDelimiterBehavior makes of the alternating gaps and matches.
std::vector<Segment> apply_behavior(const std::vector<Segment>& segments, SplitPreTokenizer::Behavior b) {
  using B = SplitPreTokenizer::Behavior;
  std::vector<Segment> out;
  bool previous_match = false;
  switch (b) {
    case B::Isolated:
      return segments;
    case B::Removed:
      for (const auto& s : segments)
        if (!s.is_match) out.push_back(s);
      return out;
    case B::MergedWithPrevious:
      for (const auto& s : segments) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
    case B::MergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
    case B::Contiguous:
      for (size_t i = 0; i < segments.size(); ++i) {
        if (i > 0 && segments[i].is_match == previous_match) {
          out.back().end = segments[i].end;
        } else {
          out.push_back(segments[i]);
        }
        previous_match = segments[i].is_match;
      }
      return out;
  }
  return out;
}

}  // namespace

SplitPreTokenizer SplitPreTokenizer::from_json(const nlohmann::json& j, const std::string& source) {
  SplitPreTokenizer p;
  if (!j.is_null()) p.add_from_json(j, source);
  return p;
}

void SplitPreTokenizer::add_from_json(const nlohmann::json& j, const std::string& source) {
  KILN_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
             source << ": pre_tokenizer entry " << j.dump().substr(0, 120) << " has no \"type\"");
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    KILN_CHECK(j.contains("pretokenizers") && j["pretokenizers"].is_array(),
               source << ": Sequence pre_tokenizer without a \"pretokenizers\" list");
    for (const auto& step : j["pretokenizers"]) add_from_json(step, source);
    return;
  }
  Step step;
  if (type == "Split") {
    KILN_CHECK(j.contains("pattern") && j["pattern"].is_object(),
               source << ": Split pre_tokenizer without a \"pattern\" object");
    const auto& pattern = j["pattern"];
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      step.regex = std::make_shared<Regex>(Regex::compile(pattern["Regex"].get<std::string>(), source));
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      step.literal = pattern["String"].get<std::string>();
      KILN_CHECK(!step.literal.empty(), source << ": Split pre_tokenizer with an empty String pattern");
    } else {
      KILN_FAIL(source << ": Split pattern " << pattern.dump()
                       << " is neither {\"Regex\": ...} nor {\"String\": ...}");
    }
    step.behavior = parse_behavior(j.value("behavior", std::string("Isolated")), source);
    step.invert = j.value("invert", false);
  } else if (type == "ByteLevel") {
    step.kind = Step::Kind::ByteLevel;
    step.add_prefix_space = j.value("add_prefix_space", true);
    if (j.value("use_regex", true))
      step.regex = std::make_shared<Regex>(Regex::compile(kGpt2Pattern, source));
  } else {
    KILN_FAIL(source << ": unsupported pre_tokenizer \"" << type
                     << "\" for a BPE tokenizer (supported: Sequence, Split, ByteLevel)");
  }
  steps_.push_back(std::move(step));
}

std::vector<NormalizedText> SplitPreTokenizer::split(const NormalizedText& piece, const Step& step,
                                                     Regex::Budget& budget) {
  // Code points, with the byte offset each starts at (and one past the end).
  std::u32string text;
  std::vector<size_t> starts;
  for (size_t pos = 0; pos < piece.text.size();) {
    starts.push_back(pos);
    text.push_back(unicode::next_code_point(piece.text, pos, "pre-tokenizer"));
  }
  starts.push_back(piece.text.size());

  std::vector<Segment> segments;
  size_t previous = 0;
  auto add_match = [&](size_t b, size_t e) {
    if (b > previous) segments.push_back({previous, b, false});
    segments.push_back({b, e, true});
    previous = e;
  };
  if (step.regex) {
    size_t from = 0, b = 0, e = 0;
    while (from <= text.size() && step.regex->search(text, from, b, e, budget)) {
      add_match(b, e);
      from = e > b ? e : e + 1;  // after an empty match, search again one character later
    }
  } else {
    const std::u32string needle = unicode::decode_utf8(step.literal, "pre-tokenizer");
    for (size_t at = text.find(needle); at != std::u32string::npos;
         at = text.find(needle, at + needle.size())) {
      add_match(at, at + needle.size());
    }
  }
  if (previous < text.size()) segments.push_back({previous, text.size(), false});
  if (step.invert) {
    for (auto& s : segments) s.is_match = !s.is_match;
  }

  std::vector<NormalizedText> out;
  for (const auto& s : apply_behavior(segments, step.behavior)) {
    if (s.end > s.begin) out.push_back(piece.substr(starts[s.begin], starts[s.end] - starts[s.begin]));
  }
  return out;
}

NormalizedText SplitPreTokenizer::byte_level(const NormalizedText& piece) {
  NormalizedText out;
  for (size_t i = 0; i < piece.text.size(); ++i) {
    out.append(byte_level_encode(std::string_view(piece.text).substr(i, 1)), piece.origin[i]);
  }
  return out;
}

std::vector<NormalizedText> SplitPreTokenizer::pre_tokenize(const NormalizedText& text) const {
  std::vector<NormalizedText> pieces;
  if (!text.text.empty()) pieces.push_back(text);
  for (const Step& step : steps_) {
    // One matching budget per pass over the text (its pieces together, with a prefix space each at most).
    Regex::Budget budget = Regex::budget_for(text.text.size() + pieces.size());
    std::vector<NormalizedText> next;
    for (NormalizedText& piece : pieces) {
      if (step.kind == Step::Kind::Split) {
        for (auto& p : split(piece, step, budget)) next.push_back(std::move(p));
        continue;
      }
      if (step.add_prefix_space && piece.text.front() != ' ') {
        NormalizedText spaced;
        spaced.append(" ", piece.origin.front());
        spaced.append_from(piece, 0, piece.text.size());
        piece = std::move(spaced);
      }
      if (step.regex) {
        Step isolate;
        isolate.regex = step.regex;
        for (const auto& p : split(piece, isolate, budget)) next.push_back(byte_level(p));
      } else {
        next.push_back(byte_level(piece));
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace kiln::tokenizers
