#include "kiln/core/error.h"

#include <cstdlib>

namespace kiln::detail {

void throw_error(const char* file, int line, const std::string& message) {
  // The source location helps developers; users get it only when they ask for it.
  static const bool with_location = std::getenv("KILN_ERROR_LOCATION") != nullptr;
  if (with_location) {
    throw Error(message + " [" + file + ":" + std::to_string(line) + "]");
  }
  throw Error(message);
}

}  // namespace kiln::detail
