// Whether this build drives PJRT plugins, and the entry points that say so. KILN_BUILT_WITH_PJRT (0 or 1) is
// set by CMake on this file alone: 1 where the PJRT C API header was found and plugin/ compiled. Both values
// compile the same code (the plugin calls are type-checked either way and discarded when 0), so the build
// without the header cannot drift from the one with it.
#include "backends/pjrt/plugin_factories.h"
#include "kiln/core/error.h"

namespace kiln::pjrt {
namespace {

constexpr bool kBuiltWithPjrt = KILN_BUILT_WITH_PJRT;

[[noreturn]] void unavailable() {
  KILN_FAIL(
      "PJRT: this build of Kiln has no PJRT support (the PJRT C API header was not found when it was "
      "configured). Run ./scripts/setup.sh --pjrt, then configure and build again (cmake finds the header in "
      "Kiln's cache, or set -DKILN_PJRT_INCLUDE_DIR)");
}

}  // namespace

bool built_with_pjrt() {
  return kBuiltWithPjrt;
}

void require_pjrt_support() {
  if constexpr (!kBuiltWithPjrt) unavailable();
}

std::shared_ptr<Client> Client::create(const std::string& plugin_path, const std::vector<ClientOption>& options) {
  if constexpr (kBuiltWithPjrt) {
    return create_plugin_client(plugin_path, options);
  } else {
    unavailable();
  }
}

std::shared_ptr<Topology> Topology::create(const std::string& plugin_path, const std::string& name,
                                           const std::vector<ClientOption>& options) {
  if constexpr (kBuiltWithPjrt) {
    return create_plugin_topology(plugin_path, name, options);
  } else {
    unavailable();
  }
}

}  // namespace kiln::pjrt
