// Client, devices, buffers and execution over pjrt_c_api.h (compiling and executables: pjrt_executable.cpp;
// loading: pjrt_load.cpp). Every argument is checked before it reaches the plugin, which may abort on bad
// input.
#include "backends/pjrt/pjrt_client.h"

#include <algorithm>

#include "backends/pjrt/plugin/pjrt_dtypes.h"
#include "backends/pjrt/plugin/pjrt_errors.h"
#include "backends/pjrt/plugin/plugin.h"
#include "kiln/core/error.h"

namespace kiln::pjrt {

namespace {

std::string describe(const PJRT_Api* api, PJRT_Device* device, DeviceInfo& info) {
  KILN_PJRT_ARGS(PJRT_Device_GetDescription_Args, get);
  get.device = device;
  check(api, api->PJRT_Device_GetDescription(&get), "PJRT_Device_GetDescription");
  KILN_PJRT_ARGS(PJRT_DeviceDescription_Id_Args, id);
  id.device_description = get.device_description;
  check(api, api->PJRT_DeviceDescription_Id(&id), "PJRT_DeviceDescription_Id");
  info.id = id.id;
  info.kind = description_kind(api, get.device_description);
  KILN_PJRT_ARGS(PJRT_DeviceDescription_DebugString_Args, debug);
  debug.device_description = get.device_description;
  check(api, api->PJRT_DeviceDescription_DebugString(&debug), "PJRT_DeviceDescription_DebugString");
  info.description.assign(debug.debug_string, debug.debug_string_size);
  return info.kind;
}

}  // namespace

std::string description_kind(const PJRT_Api* api, PJRT_DeviceDescription* description) {
  KILN_PJRT_ARGS(PJRT_DeviceDescription_Kind_Args, kind);
  kind.device_description = description;
  check(api, api->PJRT_DeviceDescription_Kind(&kind), "PJRT_DeviceDescription_Kind");
  return std::string(kind.device_kind, kind.device_kind_size);
}

std::shared_ptr<Client> create_plugin_client(const std::string& plugin_path,
                                             const std::vector<ClientOption>& options) {
  std::shared_ptr<Plugin> plugin = load_plugin(plugin_path, options);
  const PJRT_Api* api = plugin->api;
  ClientDescription d;
  d.plugin_path = plugin->path;
  d.api_version = std::to_string(api->pjrt_api_version.major_version) + "." +
                  std::to_string(api->pjrt_api_version.minor_version);
  KILN_PJRT_ARGS(PJRT_Client_PlatformName_Args, name);
  name.client = plugin->client;
  check(api, api->PJRT_Client_PlatformName(&name), "PJRT_Client_PlatformName");
  d.platform_name.assign(name.platform_name, name.platform_name_size);
  KILN_PJRT_ARGS(PJRT_Client_PlatformVersion_Args, version);
  version.client = plugin->client;
  check(api, api->PJRT_Client_PlatformVersion(&version), "PJRT_Client_PlatformVersion");
  d.platform_version.assign(version.platform_version, version.platform_version_size);
  for (size_t i = 0; i < plugin->devices.size(); ++i) {
    DeviceInfo info;
    info.local_index = int(i);
    describe(api, plugin->devices[i], info);
    d.devices.push_back(std::move(info));
  }
  KILN_CHECK(!d.devices.empty(), "PJRT plugin " << plugin_path << ": the client has no addressable devices");
  return std::make_shared<PluginClient>(std::move(plugin), std::move(d));
}

PluginClient::PluginClient(std::shared_ptr<Plugin> plugin, ClientDescription description)
    : Client(std::move(description)), plugin_(std::move(plugin)) {}

std::optional<DriverMemoryReport> PluginClient::memory_report(int device_index) const {
  check_device_index(device_index, "PJRT memory_report");
  const PJRT_Api* api = plugin_->api;
  if (api->PJRT_Device_MemoryStats == nullptr) return std::nullopt;
  KILN_PJRT_ARGS(PJRT_Device_MemoryStats_Args, stats);
  stats.device = plugin_->devices[size_t(device_index)];
  if (PJRT_Error* error = api->PJRT_Device_MemoryStats(&stats)) {
    discard(api, error);
    return std::nullopt;
  }
  if (!stats.bytes_limit_is_set || stats.bytes_limit <= 0) return std::nullopt;
  return DriverMemoryReport{stats.bytes_limit, std::max<int64_t>(stats.bytes_in_use, 0)};
}

void PluginClient::check_device_index(int device_index, const char* what) const {
  const size_t count = devices().size();
  KILN_CHECK(device_index >= 0 && device_index < int(count),
             what << ": device index " << device_index << " is out of range: the " << platform_name()
                  << " client has " << count << " devices (0.." << count - 1 << ")");
}

std::shared_ptr<Buffer> PluginClient::buffer_from_host(const void* data, size_t bytes, DType dtype,
                                                       const Shape& dims, int device_index) {
  constexpr const char* kWhat = "PJRT buffer_from_host";
  check_device_index(device_index, kWhat);
  int64_t numel = 1;
  for (int64_t d : dims) {
    KILN_CHECK(d >= 0, kWhat << ": dims " << shape_str(dims) << " hold a negative size");
    numel *= d;
  }
  KILN_CHECK(size_t(numel) * dtype_size(dtype) == bytes,
             kWhat << ": " << bytes << " bytes given for " << dtype_name(dtype) << shape_str(dims)
                   << ", which needs " << size_t(numel) * dtype_size(dtype));
  KILN_CHECK(data || bytes == 0, kWhat << ": no host data for " << bytes << " bytes");
  const PJRT_Api* api = plugin_->api;
  KILN_PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args, args);
  args.client = plugin_->client;
  args.data = data;
  args.type = to_pjrt(dtype);
  args.dims = dims.data();
  args.num_dims = dims.size();
  // Copied during the call (or before done_with_host_buffer fires): the caller may reuse its memory on
  // return.
  args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  args.device = plugin_->devices[device_index];
  check(api, api->PJRT_Client_BufferFromHostBuffer(&args), "PJRT_Client_BufferFromHostBuffer");
  auto buffer = std::make_shared<PluginBuffer>(plugin_, args.buffer, dtype, dims, device_index);
  await_event(api, args.done_with_host_buffer,
              "PJRT_Client_BufferFromHostBuffer (done with the host buffer)");
  return buffer;
}

// ---- Buffer

PluginBuffer::PluginBuffer(std::shared_ptr<const Plugin> plugin, PJRT_Buffer* buffer, DType dtype, Shape dims,
                           int device_index)
    : Buffer(dtype, std::move(dims), device_index), plugin_(std::move(plugin)), buffer_(buffer) {}

PluginBuffer::~PluginBuffer() {
  if (!buffer_) return;
  KILN_PJRT_ARGS(PJRT_Buffer_Destroy_Args, args);
  args.buffer = buffer_;
  discard(plugin_->api, plugin_->api->PJRT_Buffer_Destroy(&args));
}

void PluginBuffer::to_host(void* dst, size_t dst_bytes) const {
  KILN_CHECK(dst_bytes == bytes(), "PJRT Buffer::to_host: " << dst_bytes << " bytes of host memory given for "
                                                            << dtype_name(dtype()) << shape_str(dims())
                                                            << ", which has " << bytes());
  KILN_CHECK(dst || dst_bytes == 0, "PJRT Buffer::to_host: no host memory given");
  if (dst_bytes == 0) return;
  const PJRT_Api* api = plugin_->api;
  KILN_PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args, args);
  args.src = buffer_;
  args.dst = dst;
  args.dst_size = dst_bytes;
  check(api, api->PJRT_Buffer_ToHostBuffer(&args), "PJRT_Buffer_ToHostBuffer");
  await_event(api, args.event, "PJRT_Buffer_ToHostBuffer");
}

void PluginBuffer::await_ready() const {
  const PJRT_Api* api = plugin_->api;
  KILN_PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args, args);
  args.buffer = buffer_;
  check(api, api->PJRT_Buffer_ReadyEvent(&args), "PJRT_Buffer_ReadyEvent");
  await_event(api, args.event, "PJRT_Buffer_ReadyEvent");
}

}  // namespace kiln::pjrt
