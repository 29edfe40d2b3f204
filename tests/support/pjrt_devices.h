// What the tests of PJRT devices share (tests/devices, tests/dist): the skip for a build without PJRT, and
// the message of the kiln::Error a call throws.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "backends/pjrt/pjrt_client.h"
#include "kiln/core/error.h"
#include "kiln/runtime/devices.h"

// Skips when this build has no PJRT (configured before scripts/setup.sh --pjrt); a build with PJRT must find
// the CPU plugin (tests/pjrt's PjrtBuild.PluginIsInstalledWhenBuiltWithPjrt fails otherwise), so CI cannot
// skip these silently.
#define KILN_SKIP_WITHOUT_PJRT()                                                            \
  do {                                                                                      \
    if (!::kiln::pjrt::built_with_pjrt()) GTEST_SKIP() << "this build has no PJRT support"; \
  } while (0)

// Also skips a test that needs `n` devices of the test device's type on a machine with fewer (one GPU); never
// on xla-cpu, whose plugin always makes 4 (a missing plugin is PjrtBuild's failure, not a skip).
#define KILN_SKIP_WITHOUT_TEST_DEVICES(n)                                                               \
  do {                                                                                                  \
    KILN_SKIP_WITHOUT_PJRT();                                                                           \
    if (::kiln::testing::test_device_kind() != "xla-cpu" && ::kiln::testing::test_device_count() < (n)) \
      GTEST_SKIP() << "needs " << (n) << " " << ::kiln::testing::test_device_kind()                     \
                   << " devices, this machine has " << ::kiln::testing::test_device_count();            \
  } while (0)

namespace kiln::testing {

// The PJRT device type the device tests run on: $KILN_TEST_DEVICE, "xla-cpu" (the CPU plugin CI has) unless
// set; scripts/device_check.sh sets "cuda" on a GPU machine. Any other value is refused by name.
inline std::string test_device_kind() {
  const char* env = std::getenv("KILN_TEST_DEVICE");
  const std::string kind = env != nullptr && *env != '\0' ? env : "xla-cpu";
  if (kind != "xla-cpu" && kind != "cuda" && kind != "tpu")
    throw Error("KILN_TEST_DEVICE must be xla-cpu, cuda or tpu, got '" + kind + "'");
  return kind;
}

// Device `index` of that type ("xla-cpu:0").
inline Device test_device(int index) {
  return Device(test_device_kind() + ":" + std::to_string(index));
}

// How many devices of the test device's type this machine has (0 when its plugin is missing).
inline int test_device_count() {
  const std::string kind = test_device_kind();
  for (const DeviceTypeStatus& status : available_devices())
    if (device_type_name(status.type) == kind) return static_cast<int>(status.devices.size());
  return 0;
}

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
