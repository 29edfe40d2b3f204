#include "kiln/core/log.h"

#include <cstdio>
#include <mutex>

namespace kiln {

namespace {
std::mutex& handler_mutex() {
  static std::mutex m;
  return m;
}
WarningHandler& handler() {
  static WarningHandler h;
  return h;
}
}  // namespace

void warn(const std::string& message) {
  WarningHandler h;
  {
    std::lock_guard<std::mutex> lock(handler_mutex());
    h = handler();
  }
  if (h) {
    h(message);
  } else {
    std::fprintf(stderr, "kiln: warning: %s\n", message.c_str());
  }
}

WarningHandler set_warning_handler(WarningHandler h) {
  std::lock_guard<std::mutex> lock(handler_mutex());
  WarningHandler previous = std::move(handler());
  handler() = std::move(h);
  return previous;
}

}  // namespace kiln
