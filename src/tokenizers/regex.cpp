#include "tokenizers/regex.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "kiln/core/error.h"
#include "tokenizers/unicode.h"

namespace kiln::tokenizers {
namespace {

using unicode::GeneralCategory;

constexpr uint32_t bit(GeneralCategory c) {
  return 1u << static_cast<unsigned>(c);
}
constexpr uint32_t kLetters = bit(GeneralCategory::Lu) | bit(GeneralCategory::Ll) | bit(GeneralCategory::Lt) |
                              bit(GeneralCategory::Lm) | bit(GeneralCategory::Lo);
constexpr uint32_t kMarks = bit(GeneralCategory::Mn) | bit(GeneralCategory::Mc) | bit(GeneralCategory::Me);
constexpr uint32_t kNumbers = bit(GeneralCategory::Nd) | bit(GeneralCategory::Nl) | bit(GeneralCategory::No);
constexpr uint32_t kPunctuation =
    bit(GeneralCategory::Pc) | bit(GeneralCategory::Pd) | bit(GeneralCategory::Ps) |
    bit(GeneralCategory::Pe) | bit(GeneralCategory::Pi) | bit(GeneralCategory::Pf) | bit(GeneralCategory::Po);
constexpr uint32_t kSymbols =
    bit(GeneralCategory::Sm) | bit(GeneralCategory::Sc) | bit(GeneralCategory::Sk) | bit(GeneralCategory::So);
constexpr uint32_t kSeparators =
    bit(GeneralCategory::Zs) | bit(GeneralCategory::Zl) | bit(GeneralCategory::Zp);
constexpr uint32_t kOthers = bit(GeneralCategory::Cc) | bit(GeneralCategory::Cf) | bit(GeneralCategory::Cs) |
                             bit(GeneralCategory::Co) | bit(GeneralCategory::Cn);
// Oniguruma's Unicode \w: letters, marks, decimal digits and connector punctuation.
constexpr uint32_t kWord = kLetters | kMarks | bit(GeneralCategory::Nd) | bit(GeneralCategory::Pc);

// Property names as Oniguruma compares them: case-insensitive, ignoring spaces, '_' and '-'.
std::optional<uint32_t> category_mask(std::string name) {
  std::string n;
  for (char ch : name) {
    if (ch == ' ' || ch == '_' || ch == '-') continue;
    n += static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
  }
  static const std::pair<const char*, uint32_t> kNames[] = {
      {"l", kLetters},
      {"letter", kLetters},
      {"lc", bit(GeneralCategory::Lu) | bit(GeneralCategory::Ll) | bit(GeneralCategory::Lt)},
      {"l&", bit(GeneralCategory::Lu) | bit(GeneralCategory::Ll) | bit(GeneralCategory::Lt)},
      {"casedletter", bit(GeneralCategory::Lu) | bit(GeneralCategory::Ll) | bit(GeneralCategory::Lt)},
      {"lu", bit(GeneralCategory::Lu)},
      {"uppercaseletter", bit(GeneralCategory::Lu)},
      {"ll", bit(GeneralCategory::Ll)},
      {"lowercaseletter", bit(GeneralCategory::Ll)},
      {"lt", bit(GeneralCategory::Lt)},
      {"titlecaseletter", bit(GeneralCategory::Lt)},
      {"lm", bit(GeneralCategory::Lm)},
      {"modifierletter", bit(GeneralCategory::Lm)},
      {"lo", bit(GeneralCategory::Lo)},
      {"otherletter", bit(GeneralCategory::Lo)},
      {"m", kMarks},
      {"mark", kMarks},
      {"combiningmark", kMarks},
      {"mn", bit(GeneralCategory::Mn)},
      {"nonspacingmark", bit(GeneralCategory::Mn)},
      {"mc", bit(GeneralCategory::Mc)},
      {"spacingmark", bit(GeneralCategory::Mc)},
      {"me", bit(GeneralCategory::Me)},
      {"enclosingmark", bit(GeneralCategory::Me)},
      {"n", kNumbers},
      {"number", kNumbers},
      {"nd", bit(GeneralCategory::Nd)},
      {"decimalnumber", bit(GeneralCategory::Nd)},
      {"nl", bit(GeneralCategory::Nl)},
      {"letternumber", bit(GeneralCategory::Nl)},
      {"no", bit(GeneralCategory::No)},
      {"othernumber", bit(GeneralCategory::No)},
      {"p", kPunctuation},
      {"punctuation", kPunctuation},
      {"pc", bit(GeneralCategory::Pc)},
      {"pd", bit(GeneralCategory::Pd)},
      {"ps", bit(GeneralCategory::Ps)},
      {"pe", bit(GeneralCategory::Pe)},
      {"pi", bit(GeneralCategory::Pi)},
      {"pf", bit(GeneralCategory::Pf)},
      {"po", bit(GeneralCategory::Po)},
      {"s", kSymbols},
      {"symbol", kSymbols},
      {"sm", bit(GeneralCategory::Sm)},
      {"sc", bit(GeneralCategory::Sc)},
      {"sk", bit(GeneralCategory::Sk)},
      {"so", bit(GeneralCategory::So)},
      {"z", kSeparators},
      {"separator", kSeparators},
      {"zs", bit(GeneralCategory::Zs)},
      {"zl", bit(GeneralCategory::Zl)},
      {"zp", bit(GeneralCategory::Zp)},
      {"c", kOthers},
      {"other", kOthers},
      {"cc", bit(GeneralCategory::Cc)},
      {"cf", bit(GeneralCategory::Cf)},
      {"cs", bit(GeneralCategory::Cs)},
      {"co", bit(GeneralCategory::Co)},
      {"cn", bit(GeneralCategory::Cn)},
  };
  for (const auto& [key, mask] : kNames) {
    if (n == key) return mask;
  }
  return std::nullopt;
}

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  enum class Kind { Empty, Char, Class, Any, Concat, Alt, Repeat, Look, Atomic };
  Kind kind = Kind::Empty;
  char32_t c = 0;
  bool fold = false;
  uint32_t class_index = 0;
  std::vector<NodePtr> children;
  int64_t min = 0, max = 0;  // Repeat; max < 0 means unbounded
  bool greedy = true;
  bool negate = false;  // Look
  int height = 1;       // of the subtree: 1 for a leaf

  bool nullable() const {
    switch (kind) {
      case Kind::Empty:
      case Kind::Look:
        return true;
      case Kind::Char:
      case Kind::Class:
      case Kind::Any:
        return false;
      case Kind::Concat:
        for (const auto& ch : children)
          if (!ch->nullable()) return false;
        return true;
      case Kind::Alt:
        for (const auto& ch : children)
          if (ch->nullable()) return true;
        return false;
      case Kind::Repeat:
        return min == 0 || children[0]->nullable();
      case Kind::Atomic:
        return children[0]->nullable();
    }
    return true;
  }
};

NodePtr make(Node::Kind kind) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  return n;
}

class Parser {
 public:
  Parser(std::u32string pattern, const std::string& source, std::vector<Regex::CharClass>& classes)
      : p_(std::move(pattern)), source_(source), classes_(classes) {}

  NodePtr parse() {
    NodePtr n = parse_group_body(false);
    if (pos_ < p_.size()) fail("unbalanced ')'");
    return n;
  }

 private:
  // Records the height of `n`, whose children are complete, and refuses trees deeper than kMaxNesting (the
  // emitter, nullable(), the matcher's lookaheads and the destructor recurse over them).
  NodePtr sealed(NodePtr n) const {
    int below = 0;
    for (const auto& ch : n->children) below = std::max(below, ch->height);
    n->height = below + 1;
    if (n->height > Regex::kMaxNesting)
      fail("groups and quantifiers nested more than " + std::to_string(Regex::kMaxNesting) + " deep");
    return n;
  }

  [[noreturn]] void fail(const std::string& what) const {
    KILN_FAIL(source_ << ": regex \"" << unicode::encode_utf8(p_) << "\": " << what << " at character "
                      << pos_
                      << " (Kiln supports the constructs of tokenizer pre-tokenizer patterns; see "
                         "src/tokenizers/regex.h)");
  }
  bool at_end() const { return pos_ >= p_.size(); }
  char32_t peek(size_t ahead = 0) const { return pos_ + ahead < p_.size() ? p_[pos_ + ahead] : 0; }

  // Alternatives up to the closing ')' (not consumed) or the end. A leading (?i) / (?-i) sets the flags of
  // the whole group.
  NodePtr parse_group_body(bool fold) {
    if (peek() == U'(' && peek(1) == U'?') {
      size_t save = pos_;
      pos_ += 2;
      std::optional<bool> flag = parse_flags();
      if (flag && peek() == U')') {
        ++pos_;
        fold = *flag;
      } else {
        pos_ = save;
      }
    }
    auto alt = make(Node::Kind::Alt);
    alt->children.push_back(parse_concat(fold));
    while (peek() == U'|') {
      ++pos_;
      alt->children.push_back(parse_concat(fold));
    }
    if (alt->children.size() == 1) return std::move(alt->children[0]);
    return sealed(std::move(alt));
  }

  // After "(?": "i", "-i" (the flags Kiln knows); nullopt when something else follows.
  std::optional<bool> parse_flags() {
    if (peek() == U'i') {
      ++pos_;
      return true;
    }
    if (peek() == U'-' && peek(1) == U'i') {
      pos_ += 2;
      return false;
    }
    return std::nullopt;
  }

  NodePtr parse_concat(bool fold) {
    auto cat = make(Node::Kind::Concat);
    while (!at_end() && peek() != U'|' && peek() != U')') {
      NodePtr atom = parse_atom(fold);
      cat->children.push_back(parse_quantifiers(std::move(atom)));
    }
    if (cat->children.size() == 1) return std::move(cat->children[0]);
    return sealed(std::move(cat));
  }

  NodePtr parse_quantifiers(NodePtr atom) {
    while (!at_end()) {
      int64_t min = 0, max = -1;
      const char32_t q = peek();
      bool interval = false;
      if (q == U'?') {
        min = 0, max = 1;
      } else if (q == U'*') {
        min = 0, max = -1;
      } else if (q == U'+') {
        min = 1, max = -1;
      } else if (q == U'{' && parse_interval_ahead(min, max)) {
        interval = true;
      } else {
        break;
      }
      if (!interval) ++pos_;
      if (atom->kind == Node::Kind::Look) fail("a quantifier on a lookahead");
      if (max < 0 && atom->nullable())
        fail("an unbounded quantifier on an expression that can match empty text");
      if (max >= 0 && max < min) fail("an interval {n,m} with m < n");
      if (min > 1000 || max > 1000) fail("an interval above 1000");
      auto rep = make(Node::Kind::Repeat);
      rep->min = min;
      rep->max = max;
      if (peek() == U'?') {
        ++pos_;
        rep->greedy = false;
      } else if (peek() == U'+' && !interval) {
        ++pos_;  // possessive: the greedy repeat, never given back
        rep->children.push_back(std::move(atom));
        auto atomic = make(Node::Kind::Atomic);
        atomic->children.push_back(sealed(std::move(rep)));
        atom = sealed(std::move(atomic));
        continue;
      }
      rep->children.push_back(std::move(atom));
      atom = sealed(std::move(rep));
    }
    return atom;
  }

  // At '{': reads {n}, {n,}, {,m} or {n,m} and returns true; otherwise leaves pos_ and returns false (then
  // '{' is a literal, as in Oniguruma).
  bool parse_interval_ahead(int64_t& min, int64_t& max) {
    size_t i = pos_ + 1;
    auto number = [&](int64_t& out) {
      size_t start = i;
      out = 0;
      while (i < p_.size() && p_[i] >= U'0' && p_[i] <= U'9' && i - start < 6)
        out = out * 10 + (p_[i++] - U'0');
      return i > start;
    };
    int64_t a = 0, b = 0;
    const bool has_a = number(a);
    if (i < p_.size() && p_[i] == U'}') {
      if (!has_a) return false;
      min = max = a;
      pos_ = i + 1;
      return true;
    }
    if (i >= p_.size() || p_[i] != U',') return false;
    ++i;
    const bool has_b = number(b);
    if (i >= p_.size() || p_[i] != U'}' || (!has_a && !has_b)) return false;
    min = has_a ? a : 0;
    max = has_b ? b : -1;
    pos_ = i + 1;
    return true;
  }

  NodePtr parse_atom(bool fold) {
    const char32_t c = peek();
    if (c == U'(') return parse_group(fold);
    if (c == U'[') return parse_class(fold);
    if (c == U'.') {
      ++pos_;
      return make(Node::Kind::Any);
    }
    if (c == U'^' || c == U'$') fail("anchors are not supported");
    if (c == U'*' || c == U'+' || c == U'?') fail("a quantifier with nothing to repeat");
    if (c == U'\\') return parse_escape(fold);
    ++pos_;
    return literal(c, fold);
  }

  NodePtr literal(char32_t c, bool fold) {
    auto n = make(Node::Kind::Char);
    n->fold = fold;
    n->c = fold ? unicode::simple_case_fold(c) : c;
    return n;
  }

  NodePtr class_node(Regex::CharClass cls, bool fold) {
    auto n = make(Node::Kind::Class);
    n->fold = fold;
    n->class_index = static_cast<uint32_t>(classes_.size());
    classes_.push_back(std::move(cls));
    return n;
  }

  NodePtr parse_group(bool fold) {
    // The parser recurses once per open group, before any node of it exists to be sealed.
    if (++open_groups_ > Regex::kMaxNesting)
      fail("groups nested more than " + std::to_string(Regex::kMaxNesting) + " deep");
    ++pos_;  // '('
    NodePtr body;
    if (peek() == U'?') {
      ++pos_;
      const char32_t kind = peek();
      if (kind == U':') {
        ++pos_;
        body = parse_group_body(fold);
      } else if (kind == U'=' || kind == U'!') {
        ++pos_;
        auto look = make(Node::Kind::Look);
        look->negate = kind == U'!';
        look->children.push_back(parse_group_body(fold));
        body = sealed(std::move(look));
      } else if (kind == U'>') {
        ++pos_;
        auto atomic = make(Node::Kind::Atomic);
        atomic->children.push_back(parse_group_body(fold));
        body = sealed(std::move(atomic));
      } else if (std::optional<bool> flag = parse_flags()) {
        if (peek() != U':') fail("inline flags other than at the start of a group");
        ++pos_;
        body = parse_group_body(*flag);
      } else if (kind == U'<') {
        fail("lookbehind and named groups are not supported");
      } else {
        fail("unsupported group syntax");
      }
    } else {
      body = parse_group_body(fold);  // captures are not needed: a plain group
    }
    if (peek() != U')') fail("missing ')'");
    ++pos_;
    --open_groups_;
    return body;
  }

  // A shorthand class escape (\s \S \d \D \w \W \p{..} \P{..}) at pos_ (after the backslash), or nullopt.
  std::optional<Regex::ClassItem> class_escape() {
    Regex::ClassItem item;
    const char32_t e = peek();
    switch (e) {
      case U's':
      case U'S':
        item.kind = Regex::ClassItem::Kind::Space;
        item.negated = e == U'S';
        ++pos_;
        return item;
      case U'd':
      case U'D':
        item.kind = Regex::ClassItem::Kind::Digit;
        item.negated = e == U'D';
        ++pos_;
        return item;
      case U'w':
      case U'W':
        item.kind = Regex::ClassItem::Kind::Word;
        item.negated = e == U'W';
        ++pos_;
        return item;
      case U'p':
      case U'P': {
        ++pos_;
        item.kind = Regex::ClassItem::Kind::Categories;
        item.negated = e == U'P';
        if (peek() != U'{') fail("expected '{' after \\p");
        ++pos_;
        if (peek() == U'^') {
          item.negated = !item.negated;
          ++pos_;
        }
        std::string name;
        while (!at_end() && peek() != U'}') unicode::append_utf8(name, p_[pos_++]);
        if (at_end()) fail("missing '}' after \\p{");
        ++pos_;
        const auto mask = category_mask(name);
        if (!mask) fail("unknown property \\p{" + name + "} (general categories are supported)");
        item.categories = *mask;
        return item;
      }
      default:
        return std::nullopt;
    }
  }

  // A single-character escape at pos_ (after the backslash).
  char32_t char_escape() {
    const char32_t e = peek();
    ++pos_;
    switch (e) {
      case U'n':
        return U'\n';
      case U'r':
        return U'\r';
      case U't':
        return U'\t';
      case U'f':
        return U'\f';
      case U'v':
        return U'\v';
      case U'e':
        return 0x1B;
      case U'a':
        return 0x07;
      case U'0':
        return 0;
      case U'x': {
        if (peek() == U'{') {
          ++pos_;
          char32_t v = hex_digits(8, true);
          if (peek() != U'}') fail("missing '}' in \\x{...}");
          ++pos_;
          return v;
        }
        return hex_digits(2, false);
      }
      case U'u':
        return hex_digits(4, false);
      default:
        break;
    }
    if ((e >= U'a' && e <= U'z') || (e >= U'A' && e <= U'Z') || (e >= U'0' && e <= U'9')) {
      --pos_;
      fail("unsupported escape \\" + unicode::encode_utf8(std::u32string(1, e)));
    }
    return e;  // escaped punctuation stands for itself
  }

  char32_t hex_digits(size_t max_digits, bool variable) {
    char32_t v = 0;
    size_t n = 0;
    while (n < max_digits && !at_end()) {
      const char32_t h = peek();
      int d = h >= U'0' && h <= U'9'   ? int(h - U'0')
              : h >= U'a' && h <= U'f' ? int(h - U'a' + 10)
              : h >= U'A' && h <= U'F' ? int(h - U'A' + 10)
                                       : -1;
      if (d < 0) break;
      v = v * 16 + static_cast<char32_t>(d);
      ++pos_, ++n;
    }
    if (n == 0 || (!variable && n != max_digits)) fail("malformed hexadecimal escape");
    if (v > 0x10FFFF) fail("code point above U+10FFFF");
    return v;
  }

  NodePtr parse_escape(bool fold) {
    ++pos_;  // backslash
    if (at_end()) fail("trailing backslash");
    if (auto item = class_escape()) {
      Regex::CharClass cls;
      cls.items.push_back(*item);
      return class_node(std::move(cls), fold);
    }
    return literal(char_escape(), fold);
  }

  NodePtr parse_class(bool fold) {
    ++pos_;  // '['
    Regex::CharClass cls;
    if (peek() == U'^') {
      cls.negated = true;
      ++pos_;
    }
    bool first = true;
    while (true) {
      if (at_end()) fail("missing ']'");
      char32_t c = peek();
      if (c == U']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      if (c == U'[') fail("nested classes and class operations are not supported");
      char32_t lo;
      if (c == U'\\') {
        ++pos_;
        if (at_end()) fail("trailing backslash");
        if (auto item = class_escape()) {
          cls.items.push_back(*item);
          continue;
        }
        lo = char_escape();
      } else {
        lo = c;
        ++pos_;
      }
      char32_t hi = lo;
      if (peek() == U'-' && peek(1) != U']' && pos_ + 1 < p_.size()) {
        ++pos_;
        char32_t h = peek();
        if (h == U'\\') {
          ++pos_;
          if (at_end()) fail("trailing backslash");
          if (class_escape()) fail("a range ending in a class escape");
          hi = char_escape();
        } else {
          hi = h;
          ++pos_;
        }
        if (hi < lo) fail("a range whose end is below its start");
      }
      if (fold) fail("a case-insensitive class with literal characters or ranges");
      Regex::ClassItem item;
      item.kind = Regex::ClassItem::Kind::Range;
      item.lo = lo;
      item.hi = hi;
      cls.items.push_back(item);
    }
    return class_node(std::move(cls), fold);
  }

  std::u32string p_;
  size_t pos_ = 0;
  int open_groups_ = 0;
  const std::string& source_;
  std::vector<Regex::CharClass>& classes_;
};

class Emitter {
 public:
  Emitter(std::vector<Regex::Instruction>& code, const std::string& source, std::string_view pattern)
      : code_(code), source_(source), pattern_(pattern) {}

  void emit(const Node& n) {
    using Op = Regex::Op;
    switch (n.kind) {
      case Node::Kind::Empty:
        return;
      case Node::Kind::Char:
        push({n.fold ? Op::CharFold : Op::Char, false, n.c, 0, 0});
        return;
      case Node::Kind::Class:
        push({n.fold ? Op::ClassFold : Op::Class, false, 0, n.class_index, 0});
        return;
      case Node::Kind::Any:
        push({Op::Any, false, 0, 0, 0});
        return;
      case Node::Kind::Concat:
        for (const auto& ch : n.children) emit(*ch);
        return;
      case Node::Kind::Alt: {
        std::vector<size_t> jumps;
        for (size_t i = 0; i < n.children.size(); ++i) {
          if (i + 1 < n.children.size()) {
            const size_t split = push({Op::Split, false, 0, 0, 0});
            code_[split].x = here();
            emit(*n.children[i]);
            jumps.push_back(push({Op::Jump, false, 0, 0, 0}));
            code_[split].y = here();
          } else {
            emit(*n.children[i]);
          }
        }
        for (size_t j : jumps) code_[j].x = here();
        return;
      }
      case Node::Kind::Repeat: {
        const Node& body = *n.children[0];
        for (int64_t i = 0; i < n.min; ++i) emit(body);
        if (n.max < 0) {
          const size_t loop = push({Op::Split, false, 0, 0, 0});
          const uint32_t body_start = here();
          emit(body);
          push({Op::Jump, false, 0, static_cast<uint32_t>(loop), 0});
          set_split(loop, body_start, here(), n.greedy);
          return;
        }
        std::vector<size_t> splits;
        for (int64_t i = n.min; i < n.max; ++i) {
          splits.push_back(push({Op::Split, false, 0, 0, 0}));
          code_[splits.back()].x = here();  // body start, fixed up below with the exit
          emit(body);
        }
        for (size_t s : splits) set_split(s, code_[s].x, here(), n.greedy);
        return;
      }
      case Node::Kind::Look:
      case Node::Kind::Atomic: {
        const size_t head = push({n.kind == Node::Kind::Look ? Op::Look : Op::Atomic, n.negate, 0, 0, 0});
        code_[head].x = here();
        emit(*n.children[0]);
        push({Op::Match, false, 0, 0, 0});
        code_[head].y = here();
        return;
      }
    }
  }

 private:
  uint32_t here() const { return static_cast<uint32_t>(code_.size()); }
  size_t push(const Regex::Instruction& i) {
    KILN_CHECK(code_.size() < Regex::kMaxProgram,
               source_ << ": regex \"" << pattern_ << "\" compiles to more than " << Regex::kMaxProgram
                       << " instructions (its repeats multiply; Kiln's limit for pre-tokenizer patterns)");
    code_.push_back(i);
    return code_.size() - 1;
  }
  // Greedy tries the body first, lazy the exit first.
  void set_split(size_t at, uint32_t body, uint32_t exit, bool greedy) {
    code_[at].x = greedy ? body : exit;
    code_[at].y = greedy ? exit : body;
  }
  std::vector<Regex::Instruction>& code_;
  const std::string& source_;
  std::string_view pattern_;
};

}  // namespace

bool Regex::CharClass::matches(char32_t c) const {
  bool any = false;
  for (const auto& item : items) {
    bool m = false;
    switch (item.kind) {
      case ClassItem::Kind::Range:
        m = c >= item.lo && c <= item.hi;
        break;
      case ClassItem::Kind::Categories:
        m = (item.categories >> static_cast<unsigned>(unicode::general_category(c))) & 1u;
        break;
      case ClassItem::Kind::Space:
        m = unicode::is_white_space(c);
        break;
      case ClassItem::Kind::Digit:
        m = unicode::general_category(c) == GeneralCategory::Nd;
        break;
      case ClassItem::Kind::Word:
        m = (kWord >> static_cast<unsigned>(unicode::general_category(c))) & 1u;
        break;
    }
    if (m != item.negated) {
      any = true;
      break;
    }
  }
  return any != negated;
}

Regex Regex::compile(std::string_view pattern, const std::string& source) {
  Regex r;
  r.pattern_ = std::string(pattern);
  r.source_ = source;
  Parser parser(unicode::decode_utf8(pattern, "regex pattern"), source, r.classes_);
  const NodePtr root = parser.parse();
  Emitter emitter(r.program_, source, pattern);
  emitter.emit(*root);
  r.program_.push_back({Op::Match, false, 0, 0, 0});
  return r;
}

void Regex::out_of_budget() const {
  KILN_FAIL(source_ << ": regex \"" << pattern_
                    << "\" gave up: matching this text took more steps than Kiln allows (the pattern "
                       "backtracks too much, e.g. a repeat inside a repeat)");
}

bool Regex::run(std::u32string_view text, uint32_t pc, size_t pos, size_t& end, Budget& budget) const {
  std::vector<std::pair<uint32_t, size_t>> stack;
  while (true) {
    if (budget.steps == 0) out_of_budget();
    --budget.steps;
    const Instruction& in = program_[pc];
    bool ok = true;
    switch (in.op) {
      case Op::Char:
        ok = pos < text.size() && text[pos] == in.c;
        if (ok) ++pos, ++pc;
        break;
      case Op::CharFold:
        ok = pos < text.size() && unicode::simple_case_fold(text[pos]) == in.c;
        if (ok) ++pos, ++pc;
        break;
      case Op::Class:
        ok = pos < text.size() && classes_[in.x].matches(text[pos]);
        if (ok) ++pos, ++pc;
        break;
      case Op::ClassFold:
        ok = pos < text.size() && (classes_[in.x].matches(text[pos]) ||
                                   classes_[in.x].matches(unicode::simple_case_fold(text[pos])));
        if (ok) ++pos, ++pc;
        break;
      case Op::Any:
        ok = pos < text.size() && text[pos] != U'\n';
        if (ok) ++pos, ++pc;
        break;
      case Op::Split:
        stack.emplace_back(in.y, pos);
        pc = in.x;
        break;
      case Op::Jump:
        pc = in.x;
        break;
      case Op::Look: {
        size_t ignored = 0;
        ok = run(text, in.x, pos, ignored, budget) != in.negate;
        if (ok) pc = in.y;
        break;
      }
      case Op::Atomic: {
        size_t after = 0;
        ok = run(text, in.x, pos, after, budget);
        if (ok) pos = after, pc = in.y;
        break;
      }
      case Op::Match:
        end = pos;
        return true;
    }
    if (!ok) {
      if (stack.empty()) return false;
      pc = stack.back().first;
      pos = stack.back().second;
      stack.pop_back();
    }
  }
}

bool Regex::search(std::u32string_view text, size_t from, size_t& begin, size_t& end) const {
  Budget budget = budget_for(text.size());
  return search(text, from, begin, end, budget);
}

bool Regex::search(std::u32string_view text, size_t from, size_t& begin, size_t& end, Budget& budget) const {
  for (size_t start = from; start <= text.size(); ++start) {
    if (run(text, 0, start, end, budget)) {
      begin = start;
      return true;
    }
  }
  return false;
}

}  // namespace kiln::tokenizers
