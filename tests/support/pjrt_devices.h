// What the tests of PJRT devices share (tests/devices, tests/dist): the skip for a build without PJRT, and
// the message of the kiln::Error a call throws.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "backends/pjrt/pjrt_client.h"
#include "kiln/core/error.h"

// Skips when this build has no PJRT (configured before scripts/setup.sh --pjrt); a build with PJRT must find
// the CPU plugin (tests/pjrt's PjrtBuild.PluginIsInstalledWhenBuiltWithPjrt fails otherwise), so CI cannot
// skip these silently.
#define KILN_SKIP_WITHOUT_PJRT()                                                            \
  do {                                                                                      \
    if (!::kiln::pjrt::built_with_pjrt()) GTEST_SKIP() << "this build has no PJRT support"; \
  } while (0)

namespace kiln::testing {

// The message of the kiln::Error `f` throws, or "(no error)".
inline std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace kiln::testing
