// The regular expressions of tokenizer.json pre-tokenizers (Split patterns, ByteLevel's GPT-2 pattern),
// matched as HF tokenizers matches them with Oniguruma: leftmost match, alternatives tried in order, greedy
// quantifiers that backtrack. Patterns are compiled once; matching runs on decoded code points with an
// explicit backtracking stack (no recursion per character, so long inputs cannot overflow the call stack).
//
// Supported: literals and escapes (\r \n \t \f \v \e \0 \xHH \x{H..} \uHHHH, escaped punctuation), `.`,
// classes
// [...] / [^...] with ranges, \s \S \d \D \w \W, \p{..} / \P{..} / \p{^..} on general categories (L Lu Ll Lt
// Lm Lo M Mn Mc Me N Nd Nl No P.. S.. Z.. C.., and their long names), groups (...) (?:...) (?i:...)
// (?-i:...), inline (?i) / (?-i) up to the group's end, lookahead (?=...) (?!...), atomic groups (?>...), and
// the quantifiers ? * + {n} {n,} {,m} {n,m}, lazy (…?) or possessive (…+ after ? * +). Case-insensitive
// matching compares simple case foldings (so (?i:'s) also matches "'S" and "'ſ", as Oniguruma does); inside
// (?i), classes may only test properties, not literal characters or ranges. Anything else (anchors,
// back-references, lookbehind) is rejected when the pattern is compiled, naming it.
//
// Patterns come from downloaded files, so their cost is bounded: groups and quantifiers nest at most
// kMaxNesting deep (the compiler, the matcher's lookaheads and the parse tree recurse that deep), a compiled
// program has at most kMaxProgram instructions (intervals multiply: (a{1000}){1000}), and matching stops with
// a kiln::Error once it has executed more instructions than its Budget allows (patterns like (a+)+b that
// backtrack exponentially on some texts, as Oniguruma's retry limit stops them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tokenizers {

class Regex {
 public:
  static constexpr int kMaxNesting = 100;
  static constexpr size_t kMaxProgram = size_t{1} << 18;

  // Instructions the matcher may still execute; one budget is shared by the searches of one pass over a text.
  struct Budget {
    uint64_t steps = 0;
  };
  // Generous for real pre-tokenizer patterns, which cost a few dozen steps per code point; linear in the
  // text, so that a pass over a text of n code points is O(n) however the searches fall.
  static Budget budget_for(size_t code_points) {
    return {(uint64_t{1} << 22) + uint64_t{1024} * code_points};
  }

  // `source` names the file for error messages.
  static Regex compile(std::string_view pattern, const std::string& source);

  // Finds the leftmost match starting at or after `from`; returns false when there is none. Throws
  // kiln::Error when the budget runs out first.
  bool search(std::u32string_view text, size_t from, size_t& begin, size_t& end, Budget& budget) const;
  // The same with a budget of its own (budget_for the text).
  bool search(std::u32string_view text, size_t from, size_t& begin, size_t& end) const;

  const std::string& pattern() const { return pattern_; }

  // Parsed pieces, public for the compiler in regex.cpp only.
  struct ClassItem {
    enum class Kind : uint8_t { Range, Categories, Space, Digit, Word };
    Kind kind = Kind::Range;
    bool negated = false;
    char32_t lo = 0, hi = 0;  // Range
    uint32_t categories = 0;  // Categories: bit i set for GeneralCategory i
  };
  struct CharClass {
    bool negated = false;
    std::vector<ClassItem> items;
    bool matches(char32_t c) const;
  };
  enum class Op : uint8_t { Char, CharFold, Class, ClassFold, Any, Split, Jump, Look, Atomic, Match };
  struct Instruction {
    Op op = Op::Match;
    bool negate = false;  // Look: negative lookahead
    char32_t c = 0;       // Char / CharFold (already folded)
    uint32_t x = 0;       // Class index; Split: preferred target; Jump / Look / Atomic: target or body start
    uint32_t y = 0;       // Split: the other target; Look / Atomic: the instruction after the body
  };

 private:
  bool run(std::u32string_view text, uint32_t pc, size_t pos, size_t& end, Budget& budget) const;
  [[noreturn]] void out_of_budget() const;

  std::string pattern_;
  std::string source_;
  std::vector<Instruction> program_;
  std::vector<CharClass> classes_;
};

}  // namespace kiln::tokenizers
