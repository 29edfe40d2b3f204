// A shared library that exports GetPjrtApi but is no working plugin: its PJRT_Api carries only a version,
// read from the environment when first asked (KILN_FAKE_PJRT_VERSION="major.minor"), so the tests can show
// what Kiln says about a plugin of an API version it does not support, before it calls anything in it.
#include <cstdlib>
#include <cstring>

#include "xla/pjrt/c/pjrt_c_api.h"

extern "C" __attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  static PJRT_Api api = [] {
    PJRT_Api made;
    std::memset(&made, 0, sizeof made);
    made.struct_size = PJRT_Api_STRUCT_SIZE;
    made.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
    int major = 0, minor = 1;
    if (const char* v = std::getenv("KILN_FAKE_PJRT_VERSION")) {
      major = std::atoi(v);
      if (const char* dot = std::strchr(v, '.')) minor = std::atoi(dot + 1);
    }
    made.pjrt_api_version.major_version = major;
    made.pjrt_api_version.minor_version = minor;
    return made;
  }();
  return &api;
}
