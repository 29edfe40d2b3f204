#include "io/json_depth.h"

#include "kiln/core/error.h"

namespace kiln::io {

void check_json_depth(std::string_view text, const std::string& origin) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      KILN_CHECK(++depth <= kMaxJsonDepth, origin << ": JSON nested deeper than " << kMaxJsonDepth
                                                  << " levels at byte " << i << " (corrupt file?)");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

}  // namespace kiln::io
