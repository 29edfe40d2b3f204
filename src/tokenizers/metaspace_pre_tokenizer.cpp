#include "tokenizers/metaspace_pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "kiln/core/error.h"
#include "tokenizers/unicode.h"

namespace kiln::tokenizers {
namespace {

void whitespace_split(const NormalizedText& in, std::vector<NormalizedText>& out) {
  const std::string& s = in.text;
  size_t word_start = std::string::npos;
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const bool space = unicode::is_white_space(unicode::next_code_point(s, pos, "WhitespaceSplit"));
    if (space && word_start != std::string::npos) {
      out.push_back(in.substr(word_start, start - word_start));
      word_start = std::string::npos;
    } else if (!space && word_start == std::string::npos) {
      word_start = start;
    }
  }
  if (word_start != std::string::npos) out.push_back(in.substr(word_start, s.size() - word_start));
}

void metaspace(const MetaspacePreTokenizer::Step& step, const NormalizedText& in,
               std::vector<NormalizedText>& out) {
  const std::string& rep = step.replacement;
  NormalizedText t;
  const bool prepend = step.prepend == MetaspacePreTokenizer::Prepend::Always ||
                       (step.prepend == MetaspacePreTokenizer::Prepend::First && in.starts_at_origin());
  // Prepending happens after spaces are replaced, so a leading space counts as a leading "▁".
  const bool starts_with_rep = in.text.rfind(rep, 0) == 0 || (!in.text.empty() && in.text[0] == ' ');
  if (prepend && !starts_with_rep) t.append(rep, in.origin.empty() ? 0 : in.origin[0]);
  for (size_t i = 0; i < in.text.size(); ++i) {
    if (in.text[i] == ' ') {
      t.append(rep, in.origin[i]);
    } else {
      t.append_from(in, i, 1);
    }
  }
  if (!step.split) {
    if (!t.text.empty()) out.push_back(std::move(t));
    return;
  }
  // Cut before each replacement character (it starts the next piece).
  size_t piece_start = 0;
  for (size_t at = t.text.find(rep, 1); at != std::string::npos; at = t.text.find(rep, at + rep.size())) {
    if (at > piece_start) out.push_back(t.substr(piece_start, at - piece_start));
    piece_start = at;
  }
  if (piece_start < t.text.size()) out.push_back(t.substr(piece_start, t.text.size() - piece_start));
}

}  // namespace

MetaspacePreTokenizer MetaspacePreTokenizer::t5_default() {
  MetaspacePreTokenizer p;
  p.steps_.push_back(Step{Step::Kind::WhitespaceSplit});
  p.steps_.push_back(Step{Step::Kind::Metaspace});
  return p;
}

MetaspacePreTokenizer MetaspacePreTokenizer::from_json(const nlohmann::json& j, const std::string& source) {
  MetaspacePreTokenizer p;
  if (!j.is_null()) p.add_from_json(j, source);
  return p;
}

void MetaspacePreTokenizer::add_from_json(const nlohmann::json& j, const std::string& source) {
  KILN_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
             source << ": pre_tokenizer entry without a \"type\": " << j.dump().substr(0, 200));
  const std::string type = j["type"];
  if (type == "Sequence") {
    for (const auto& child : j.at("pretokenizers")) add_from_json(child, source);
  } else if (type == "WhitespaceSplit") {
    steps_.push_back(Step{Step::Kind::WhitespaceSplit});
  } else if (type == "Metaspace") {
    Step s{Step::Kind::Metaspace};
    if (j.contains("replacement")) s.replacement = j["replacement"].get<std::string>();
    KILN_CHECK(!s.replacement.empty(), source << ": Metaspace replacement is empty");
    if (j.contains("prepend_scheme")) {
      const std::string scheme = j["prepend_scheme"];
      if (scheme == "always") {
        s.prepend = Prepend::Always;
      } else if (scheme == "first") {
        s.prepend = Prepend::First;
      } else if (scheme == "never") {
        s.prepend = Prepend::Never;
      } else {
        KILN_FAIL(source << ": Metaspace prepend_scheme \"" << scheme
                         << "\", expected always, first or never");
      }
    } else {
      // Files written before prepend_scheme existed carry add_prefix_space.
      s.prepend = j.value("add_prefix_space", true) ? Prepend::Always : Prepend::Never;
    }
    s.split = j.value("split", true);
    steps_.push_back(std::move(s));
  } else {
    KILN_FAIL(source << ": unsupported pre_tokenizer type \"" << type
                     << "\" (supported for Unigram tokenizers: Sequence, WhitespaceSplit, Metaspace)");
  }
}

std::vector<NormalizedText> MetaspacePreTokenizer::pre_tokenize(const NormalizedText& text) const {
  std::vector<NormalizedText> pieces{text};
  for (const Step& step : steps_) {
    std::vector<NormalizedText> next;
    for (const NormalizedText& p : pieces) {
      if (step.kind == Step::Kind::WhitespaceSplit) {
        whitespace_split(p, next);
      } else {
        metaspace(step, p, next);
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace kiln::tokenizers
