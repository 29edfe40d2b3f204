#include "kiln/core/log.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
WarningHandler& log_handler() {
  static WarningHandler h;
  return h;
}
std::string& log_topics() {
  static std::string topics = [] {
    const char* v = std::getenv("KILN_LOG");
    return v ? std::string(v) : std::string();
  }();
  return topics;
}
}  // namespace

bool log_enabled(std::string_view topic) {
  std::string topics;
  {
    std::lock_guard<std::mutex> lock(handler_mutex());
    topics = log_topics();
  }
  if (topics.empty()) return false;
  size_t start = 0;
  while (start <= topics.size()) {
    const size_t end = std::min(topics.find(',', start), topics.size());
    const std::string_view t(topics.data() + start, end - start);
    if (t == topic || t == "all") return true;
    start = end + 1;
  }
  return false;
}

void log(std::string_view topic, const std::string& message) {
  WarningHandler h;
  {
    std::lock_guard<std::mutex> lock(handler_mutex());
    h = log_handler();
  }
  if (h) {
    h(std::string(topic) + ": " + message);
  } else {
    // Seconds since the first message: what moved when (offloading, compiling) reads off the log itself.
    static const auto first = std::chrono::steady_clock::now();
    const double at = std::chrono::duration<double>(std::chrono::steady_clock::now() - first).count();
    std::fprintf(stderr, "kiln[%.*s %8.3fs]: %s\n", static_cast<int>(topic.size()), topic.data(), at,
                 message.c_str());
  }
}

WarningHandler set_log_handler(WarningHandler h) {
  std::lock_guard<std::mutex> lock(handler_mutex());
  WarningHandler previous = std::move(log_handler());
  log_handler() = std::move(h);
  return previous;
}

void set_log_topics(const std::string& topics) {
  std::lock_guard<std::mutex> lock(handler_mutex());
  log_topics() = topics;
}

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
