// A PJRT plugin and its client, in Kiln's terms: the thin C++ layer over pjrt_c_api.h that the PJRT backend
// (src/backends/pjrt/) uses and nothing else includes. A plugin is a shared library exporting GetPjrtApi
// (the TPU's libtpu.so, the NVIDIA plugin of jax-cuda13-pjrt, the CPU plugin CI tests with); see
// docs/devices.md.
//
// Every failure is a kiln::Error naming the plugin call and carrying the plugin's message. Arguments are
// checked here before they reach the plugin (plugins abort on some malformed input instead of returning an
// error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/pjrt/client_options.h"
#include "kiln/core/allocator.h"
#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"

namespace kiln::pjrt {

// Whether this build has PJRT support: the PJRT C API header was found at configure time (see
// scripts/fetch_pjrt.sh) and plugin/ was compiled. Without it Client::create and Topology::create throw,
// saying how to get it.
bool built_with_pjrt();
// Throws, saying how to get PJRT support, in a build without it; returns otherwise. Asked before looking for a
// plugin, so that such a build says what it lacks rather than which plugin it did not find.
void require_pjrt_support();

// An array's element type and dimensions: an executable's parameter or output.
struct ArraySpec {
  DType dtype = DType::Float32;
  Shape dims;
  bool operator==(const ArraySpec&) const = default;
};

// One device of a client, as the plugin describes it.
struct DeviceInfo {
  int id = 0;           // the plugin's device id
  int local_index = 0;  // position among the client's addressable devices (what Kiln's device index means)
  std::string kind;     // the plugin's device kind ("cpu", "NVIDIA H200", "TPU v5 lite", ...)
  std::string description;
};

// The classes below are what the rest of Kiln sees of PJRT: what Kiln knows of a buffer, an executable or a
// client is held here, and what only the plugin can do is virtual, implemented in plugin/ (the only code that
// includes pjrt_c_api.h, compiled only where that header was found). So the library compiles the same with
// or without the header, and nothing outside plugin/ depends on which.

// A device buffer: an array of `dtype` with `dims` on one device. Destroyed (PJRT_Buffer_Destroy) with the
// last reference.
class Buffer {
 public:
  virtual ~Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  DType dtype() const { return dtype_; }
  const Shape& dims() const { return dims_; }
  size_t bytes() const { return size_t(shape_numel(dims_)) * dtype_size(dtype_); }
  int device_index() const { return device_index_; }
  // Copies the whole buffer to `dst` (exactly bytes() bytes), waiting for it and for the copy.
  virtual void to_host(void* dst, size_t dst_bytes) const = 0;
  // Waits until the buffer's value is computed; throws the computation's error.
  virtual void await_ready() const = 0;

 protected:
  Buffer(DType dtype, Shape dims, int device_index)
      : dtype_(dtype), dims_(std::move(dims)), device_index_(device_index) {}

 private:
  DType dtype_;
  Shape dims_;
  int device_index_;
};

// What a compiled program takes and gives, and where it runs.
struct ExecutableLayout {
  // @main's parameters (read from the module text at compile time) and the outputs (as the plugin reports
  // them).
  std::vector<ArraySpec> parameters, outputs;
  int num_replicas = 1, num_partitions = 1;
  // The Kiln device indices it runs on, one per argument list; empty for a portable executable (compiled
  // 1 x 1: it runs on the device execute_on names).
  std::vector<int> device_indices;
  std::optional<int64_t> scratch_bytes;  // Executable::scratch_bytes
};

// A compiled program (PJRT_LoadedExecutable), run with Client::execute.
class Executable {
 public:
  virtual ~Executable() = default;
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  int num_outputs() const { return int(layout_.outputs.size()); }
  const std::vector<ArraySpec>& parameters() const { return layout_.parameters; }
  const std::vector<ArraySpec>& outputs() const { return layout_.outputs; }
  int num_replicas() const { return layout_.num_replicas; }
  int num_partitions() const { return layout_.num_partitions; }
  // The Kiln device indices it runs on, one per argument list of Client::execute, in order; empty for a 1 x 1
  // (portable) executable, which runs on the device its arguments are on, or the one execute_on names.
  const std::vector<int>& devices() const { return layout_.device_indices; }
  // The device memory one run needs besides its arguments and outputs: XLA's temporary buffers, which hold a
  // compiled forward's activations (PJRT_Executable_GetCompiledMemoryStats' temp size). nullopt when the
  // plugin does not report it.
  std::optional<int64_t> scratch_bytes() const { return layout_.scratch_bytes; }
  // The executable's bytes (PJRT_Executable_Serialize) behind a one-line Kiln header holding the parameters
  // (which PJRT does not report), for Client::deserialize in another process of the same plugin version.
  virtual std::string serialize() const = 0;

 protected:
  explicit Executable(ExecutableLayout layout) : layout_(std::move(layout)) {}

 private:
  ExecutableLayout layout_;
};

// What a client says of itself once created.
struct ClientDescription {
  std::string plugin_path;
  std::string api_version;  // "0.115": the plugin's PJRT C API version
  std::string platform_name, platform_version;
  std::vector<DeviceInfo> devices;
};

class Client {
 public:
  // Loads the plugin at `path` (dlopen, GetPjrtApi, the API version checked, PJRT_Plugin_Initialize) and
  // creates its client. Errors name the path: no such file, not a PJRT plugin (no GetPjrtApi), an API major
  // version other than the header's, a minor version older than Kiln needs, or the plugin's own failure (for
  // example "No visible GPU devices", or an option it does not take). `options` go to PJRT_Client_Create
  // (client_options.h). In a build without PJRT support (built_with_pjrt()), throws saying how to get it.
  static std::shared_ptr<Client> create(const std::string& plugin_path,
                                        const std::vector<ClientOption>& options = {});
  virtual ~Client() = default;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& plugin_path() const { return description_.plugin_path; }
  // "0.115": the plugin's PJRT C API version.
  const std::string& api_version() const { return description_.api_version; }
  const std::string& platform_name() const { return description_.platform_name; }  // "cpu", "cuda", "tpu"
  const std::string& platform_version() const { return description_.platform_version; }  // the plugin's own
  // The addressable devices, in local_index order.
  const std::vector<DeviceInfo>& devices() const { return description_.devices; }
  // What the plugin reports of device `device_index`'s memory (PJRT_Device_MemoryStats: its allocator's
  // limit and the bytes in use); nullopt when it reports no limit or does not implement the call (the CPU
  // plugin: "GetAllocatorStats is not supported").
  virtual std::optional<DriverMemoryReport> memory_report(int device_index) const = 0;

  // Compiles StableHLO (MLIR text) for `num_replicas` x `num_partitions` devices (compile options set as the
  // plugins require). The module's text is checked to be non-empty and to hold a func.func @main first, whose
  // parameters must be statically shaped tensors of Kiln's dtypes. A 1 x 1 executable is compiled portable:
  // execute_on runs it on any device. `replica_devices` (device indices, one per replica, distinct; one
  // partition) fixes where the replicas run, in that order (Executable::devices()); empty: the plugin's
  // choice.
  virtual std::shared_ptr<Executable> compile(std::string_view mlir_text, int num_replicas = 1,
                                              int num_partitions = 1,
                                              const std::vector<int>& replica_devices = {}) = 0;
  // An executable from serialize()'s bytes, loaded on this client.
  virtual std::shared_ptr<Executable> deserialize(std::string_view bytes) = 0;

  // A buffer on device `device_index` holding a copy of `bytes` host bytes, an array of `dtype` with `dims`
  // (dense, row-major). Returns once the host memory may be reused.
  virtual std::shared_ptr<Buffer> buffer_from_host(const void* data, size_t bytes, DType dtype,
                                                   const Shape& dims, int device_index) = 0;

  // Runs `executable` on `arguments.size()` devices (one argument list per device, in the executable's device
  // order); returns each device's outputs. Asynchronous: the outputs are futures (Buffer::await_ready,
  // to_host wait for them). Argument counts, dtypes and dims are checked against the executable before the
  // call.
  virtual std::vector<std::vector<std::shared_ptr<Buffer>>> execute(
      const Executable& executable, const std::vector<std::vector<std::shared_ptr<Buffer>>>& arguments) = 0;
  // Runs a single-device executable (compiled for 1 x 1) on device `device_index` (PJRT's execute_device),
  // the strict-eager path: one op's executable serves every device of the client.
  virtual std::vector<std::shared_ptr<Buffer>> execute_on(const Executable& executable,
                                                          const std::vector<std::shared_ptr<Buffer>>& arguments,
                                                          int device_index) = 0;

 protected:
  explicit Client(ClientDescription description) : description_(std::move(description)) {}

 private:
  ClientDescription description_;
};

}  // namespace kiln::pjrt
