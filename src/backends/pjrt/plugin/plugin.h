// pjrt_client.h's and pjrt_topology.h's classes over a loaded plugin, in pjrt_c_api.h's types. Only plugin/
// includes this, and plugin/ is compiled only where the header was found (scripts/fetch_pjrt.sh); everything
// else in Kiln sees pjrt_client.h alone, so the library builds without the header.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/pjrt/pjrt_client.h"
#include "backends/pjrt/pjrt_topology.h"
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

class PluginBuffer final : public Buffer {
 public:
  PluginBuffer(std::shared_ptr<const Plugin> plugin, PJRT_Buffer* buffer, DType dtype, Shape dims,
               int device_index);
  ~PluginBuffer() override;
  void to_host(void* dst, size_t dst_bytes) const override;
  void await_ready() const override;

  const Plugin* plugin() const { return plugin_.get(); }
  PJRT_Buffer* get() const { return buffer_; }

 private:
  std::shared_ptr<const Plugin> plugin_;
  PJRT_Buffer* buffer_;
};

class PluginExecutable final : public Executable {
 public:
  // Takes ownership of `loaded`; its layout is `parameters` and what the plugin reports.
  PluginExecutable(std::shared_ptr<const Plugin> plugin, PJRT_LoadedExecutable* loaded,
                   std::vector<ArraySpec> parameters);
  ~PluginExecutable() override;
  std::string serialize() const override;

  PJRT_LoadedExecutable* get() const { return loaded_; }

 private:
  std::shared_ptr<const Plugin> plugin_;
  PJRT_LoadedExecutable* loaded_;
};

class PluginClient final : public Client {
 public:
  PluginClient(std::shared_ptr<Plugin> plugin, ClientDescription description);
  std::optional<DriverMemoryReport> memory_report(int device_index) const override;
  std::shared_ptr<Executable> compile(std::string_view mlir_text, int num_replicas, int num_partitions,
                                      const std::vector<int>& replica_devices) override;
  std::shared_ptr<Executable> deserialize(std::string_view bytes) override;
  std::shared_ptr<Buffer> buffer_from_host(const void* data, size_t bytes, DType dtype, const Shape& dims,
                                           int device_index) override;
  std::vector<std::vector<std::shared_ptr<Buffer>>> execute(
      const Executable& executable, const std::vector<std::vector<std::shared_ptr<Buffer>>>& arguments) override;
  std::vector<std::shared_ptr<Buffer>> execute_on(const Executable& executable,
                                                  const std::vector<std::shared_ptr<Buffer>>& arguments,
                                                  int device_index) override;

 private:
  void check_device_index(int device_index, const char* what) const;
  // Checks `arguments` against the executable's parameters and that each lives on `device_index` of this
  // client.
  void check_arguments(const Executable& executable, const std::vector<std::shared_ptr<Buffer>>& arguments,
                       int device_index, const char* what) const;
  std::vector<std::vector<std::shared_ptr<Buffer>>> run(
      const Executable& executable, const std::vector<std::vector<std::shared_ptr<Buffer>>>& arguments,
      const std::vector<int>& device_indices, bool portable);
  std::shared_ptr<Plugin> plugin_;
};

class PluginTopology final : public Topology {
 public:
  PluginTopology(const PJRT_Api* api, PJRT_TopologyDescription* topology, TopologyDescription description);
  ~PluginTopology() override;
  TargetProgram compile(std::string_view mlir_text, int num_replicas, int num_partitions) const override;

 private:
  const PJRT_Api* api_;
  PJRT_TopologyDescription* topology_;
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
