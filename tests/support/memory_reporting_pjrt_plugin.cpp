// A PJRT plugin that is the real one (KILN_TEST_REAL_PJRT_PLUGIN, the CPU plugin) in every call but one: it
// reports each device's memory as a GPU's plugin does (PJRT_Device_MemoryStats: a limit of
// KILN_TEST_DEVICE_MEMORY bytes, KILN_TEST_DEVICE_MEMORY_IN_USE of it in use), where the CPU plugin answers
// "not supported". With it, the tests run what Kiln does on a device whose memory is known (--offload auto
// plans for it; `kiln info --devices` shows it) with everything else real.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "xla/pjrt/c/pjrt_c_api.h"

namespace {

long long env_bytes(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? 0 : std::atoll(v);
}

PJRT_Error* memory_stats(PJRT_Device_MemoryStats_Args* args) {
  args->bytes_in_use = env_bytes("KILN_TEST_DEVICE_MEMORY_IN_USE");
  args->bytes_limit = env_bytes("KILN_TEST_DEVICE_MEMORY");
  args->bytes_limit_is_set = args->bytes_limit > 0;
  return nullptr;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  static const PJRT_Api* api = []() -> const PJRT_Api* {
    const char* path = std::getenv("KILN_TEST_REAL_PJRT_PLUGIN");
    void* handle = path == nullptr ? nullptr : dlopen(path, RTLD_NOW | RTLD_LOCAL);
    auto* get =
        handle == nullptr ? nullptr : reinterpret_cast<const PJRT_Api* (*)()>(dlsym(handle, "GetPjrtApi"));
    if (get == nullptr) {
      std::fprintf(stderr, "memory_reporting_pjrt_plugin: KILN_TEST_REAL_PJRT_PLUGIN=%s is no PJRT plugin\n",
                   path == nullptr ? "(unset)" : path);
      return nullptr;
    }
    static PJRT_Api wrapped;
    std::memcpy(&wrapped, get(), sizeof wrapped);  // this header's fields; Kiln reads no others
    wrapped.struct_size = PJRT_Api_STRUCT_SIZE;
    wrapped.PJRT_Device_MemoryStats = memory_stats;
    return &wrapped;
  }();
  return api;
}
