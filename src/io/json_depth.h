// nlohmann::json parses nesting of any depth, but printing and walking a value recurse once per level, so a
// file of a few hundred kilobytes of '[' overflows the stack when an error message dumps it. Every JSON file
// Kiln reads (safetensors headers, checkpoint indexes, configs, tokenizer files) is checked first: real ones
// nest a handful of levels.
#pragma once

#include <string>
#include <string_view>

namespace kiln::io {

inline constexpr int kMaxJsonDepth = 64;

// Throws kiln::Error naming `origin` and the byte where `text` nests arrays/objects deeper than
// kMaxJsonDepth. Brackets inside strings do not count; malformed JSON is left for the parser to report.
void check_json_depth(std::string_view text, const std::string& origin);

}  // namespace kiln::io
