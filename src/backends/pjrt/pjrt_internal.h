// What pjrt_client.h's classes hold, in pjrt_c_api.h's types. Included only by this folder's files that are
// compiled with KILN_HAVE_PJRT (the header extracted by scripts/fetch_pjrt.sh); everything else in Kiln sees
// pjrt_client.h alone, so the library builds without the header.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/pjrt/pjrt_client.h"
#include "xla/pjrt/c/pjrt_c_api.h"

// Declares `name` of type `type` zero-filled with its struct_size set: every PJRT args struct starts with its
// size, which is how a plugin built against a newer header knows which fields this caller has.
#define KILN_PJRT_ARGS(type, name) \
  type name{};                     \
  name.struct_size = type##_STRUCT_SIZE

namespace kiln::pjrt {

// A loaded plugin's API and one client of it. Buffers and executables keep it alive (shared_ptr), so the
// PJRT_Client is destroyed after everything created from it. The shared library itself is never unloaded:
// XLA plugins keep process-wide state (threads, registries) that dlclose would pull from under them.
class Plugin {
 public:
  ~Plugin();
  const PJRT_Api* api = nullptr;
  PJRT_Client* client = nullptr;
  std::string path;
  std::vector<PJRT_Device*> devices;  // the addressable devices, in Kiln's device index order

  // The Kiln index of `device`; -1 when it is not one of this client's addressable devices.
  int index_of(const PJRT_Device* device) const;
};

struct Client::State {
  std::shared_ptr<Plugin> plugin;
  std::vector<DeviceInfo> devices;
  std::string api_version, platform_name, platform_version;
};

struct Buffer::Raw {
  PJRT_Buffer* buffer = nullptr;
};

struct Executable::Raw {
  PJRT_LoadedExecutable* loaded = nullptr;
  std::vector<ArraySpec> parameters;
  std::vector<ArraySpec> outputs;
  int num_replicas = 1;
  int num_partitions = 1;
  // The Kiln device indices the executable runs on, one per argument list; empty for a portable executable
  // (compiled 1 x 1: it runs on the device execute_on names).
  std::vector<int> device_indices;
  std::optional<int64_t> scratch_bytes;  // Executable::scratch_bytes
};

}  // namespace kiln::pjrt

namespace kiln::pjrt {
// Loads the plugin at `path` (once per process) and creates a client with its addressable devices, passing
// `options` to PJRT_Client_Create.
std::shared_ptr<Plugin> load_plugin(const std::string& path, const std::vector<ClientOption>& options);
// The plugin at `path`: dlopen'ed, its API version checked and PJRT_Plugin_Initialize called, once per
// process (later calls return the same API). Errors name the path.
const PJRT_Api* load_api(const std::string& path);
// A PJRT_Executable owned for one scope (destroyed after use): the one behind a loaded executable (which
// PJRT_Executable_* calls need), or one PJRT_Compile returned.
class Unloaded {
 public:
  Unloaded(const PJRT_Api* api, PJRT_LoadedExecutable* loaded);
  Unloaded(const PJRT_Api* api, PJRT_Executable* adopted) : api_(api), executable_(adopted) {}
  ~Unloaded();
  Unloaded(const Unloaded&) = delete;
  Unloaded& operator=(const Unloaded&) = delete;
  PJRT_Executable* get() const { return executable_; }

 private:
  const PJRT_Api* api_;
  PJRT_Executable* executable_ = nullptr;
};

// What the plugin says an executable's runs need (PJRT_Executable_GetCompiledMemoryStats); nullopt when it
// leaves the call out or answers that it is unimplemented, which is not an error.
std::optional<PJRT_Executable_GetCompiledMemoryStats_Args> compiled_memory_stats(const PJRT_Api* api,
                                                                                 PJRT_Executable* exe);

// The device kind a device description names ("cpu", "NVIDIA H200", "TPU v5 lite").
std::string description_kind(const PJRT_Api* api, PJRT_DeviceDescription* description);

// A PJRT_Program of the MLIR text in `code`, which must outlive it (PJRT's code field is a mutable char*).
PJRT_Program mlir_program(std::string& code);
// `options` as the PJRT_NamedValues a create call takes; they point into `options`, which must outlive them.
std::vector<PJRT_NamedValue> named_values(const std::vector<ClientOption>& options);
}  // namespace kiln::pjrt
