#include "backends/pjrt/client_options.h"

#include <cstdlib>
#include <string>

#include "kiln/core/error.h"

namespace kiln::pjrt {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

float memory_fraction() {
  const std::string text = env("KILN_PJRT_MEMORY_FRACTION");
  if (text.empty()) return 0.9f;
  char* end = nullptr;
  const float f = std::strtof(text.c_str(), &end);
  KILN_CHECK(
      end != text.c_str() && *end == '\0' && f > 0 && f <= 1,
      "KILN_PJRT_MEMORY_FRACTION=" << text
                                   << ": expected the share of the GPU's memory the plugin may hold, a "
                                      "number in (0, 1] such as 0.9");
  return f;
}

bool preallocate() {
  const std::string text = env("KILN_PJRT_PREALLOCATE");
  KILN_CHECK(text.empty() || text == "0" || text == "1",
             "KILN_PJRT_PREALLOCATE="
                 << text << ": expected 1 (take the GPU's memory at start-up) or 0 (grow as needed)");
  return text == "1";
}

}  // namespace

std::vector<ClientOption> client_options(DeviceType type) {
  if (type != DeviceType::CUDA) return {};
  return {{"memory_fraction", memory_fraction()}, {"preallocate", preallocate()}};
}

}  // namespace kiln::pjrt
