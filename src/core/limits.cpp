#include "kiln/core/limits.h"

#include "kiln/core/error.h"

namespace kiln::limits {

void check_range(std::string_view what, int64_t value, int64_t min, int64_t max) {
  KILN_CHECK(value <= max, what << " " << value << " exceeds the maximum " << max);
  KILN_CHECK(value >= min, what << " " << value << " is below the minimum " << min);
}

void check_config(const std::string& source, std::initializer_list<ConfigBound> bounds) {
  for (const ConfigBound& b : bounds) check_range(source + ": " + b.key, b.value, b.min, b.max);
}

void check_prompt_size(std::string_view what, std::string_view prompt) {
  KILN_CHECK(static_cast<int64_t>(prompt.size()) <= kMaxPromptBytes,
             what << " is " << prompt.size() << " bytes, more than the maximum " << kMaxPromptBytes);
}

}  // namespace kiln::limits
