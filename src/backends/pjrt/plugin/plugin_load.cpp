// Loading a plugin: dlopen, GetPjrtApi, the API version check, PJRT_Plugin_Initialize, PJRT_Client_Create.
#include <dlfcn.h>
#include <sys/stat.h>

#include <map>
#include <mutex>
#include <type_traits>
#include <variant>
#include <vector>

#include "backends/pjrt/plugin/pjrt_errors.h"
#include "backends/pjrt/plugin/plugin.h"
#include "kiln/core/error.h"

namespace kiln::pjrt {

// The oldest plugin API Kiln runs on: the header's own version (0.90). Kiln calls only functions that exist
// in it, and an older plugin's PJRT_Api would end before some of them. Newer plugins are fine: they read only
// the struct_size bytes this header's args structs declare.
constexpr int kMinMinor = PJRT_API_MINOR;

// dlopen'ed plugins, initialised once per process (PJRT_Plugin_Initialize is once per plugin, and a second
// dlopen of the same file returns the same library anyway).
const PJRT_Api* load_api(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, const PJRT_Api*> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = loaded.find(path); it != loaded.end()) return it->second;

  struct stat st {};
  KILN_CHECK(stat(path.c_str(), &st) == 0,
             "PJRT plugin " << path
                            << ": no such file (set KILN_PJRT_PLUGIN to a plugin's .so, or install one: "
                            << "./scripts/setup.sh --pjrt for the CPU plugin)");
  // RTLD_LOCAL: the plugin's LLVM, protobuf and absl stay out of the global namespace, where they would clash
  // with another plugin's or the host's.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    KILN_FAIL("PJRT plugin " << path << ": cannot be loaded: " << (why ? why : "dlopen failed"));
  }
  using GetApi = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetApi>(dlsym(handle, "GetPjrtApi"));
  if (!get_api) {
    dlclose(handle);  // not a plugin: nothing of it runs, so it can go
    KILN_FAIL("PJRT plugin " << path << ": not a PJRT plugin (it exports no GetPjrtApi)");
  }
  const PJRT_Api* api = get_api();
  KILN_CHECK(api, "PJRT plugin " << path << ": GetPjrtApi returned no API");
  const int major = api->pjrt_api_version.major_version, minor = api->pjrt_api_version.minor_version;
  KILN_CHECK(major == PJRT_API_MAJOR && minor >= kMinMinor,
             "PJRT plugin " << path << ": PJRT C API version " << major << "." << minor
                            << " is not supported: Kiln "
                            << "needs " << PJRT_API_MAJOR << "." << kMinMinor << " or a newer "
                            << PJRT_API_MAJOR << ".x (install a newer plugin)");
  KILN_CHECK(api->struct_size >= PJRT_Api_STRUCT_SIZE,
             "PJRT plugin " << path << ": its PJRT_Api has " << api->struct_size << " bytes, fewer than the "
                            << PJRT_Api_STRUCT_SIZE << " of API " << PJRT_API_MAJOR << "." << kMinMinor);
  if (api->PJRT_Plugin_Initialize) {
    KILN_PJRT_ARGS(PJRT_Plugin_Initialize_Args, init);
    check(api, api->PJRT_Plugin_Initialize(&init), "PJRT_Plugin_Initialize");
  }
  loaded.emplace(path, api);
  return api;
}

std::vector<PJRT_NamedValue> named_values(const std::vector<ClientOption>& options) {
  std::vector<PJRT_NamedValue> named(options.size());
  for (size_t i = 0; i < options.size(); ++i) {
    PJRT_NamedValue& v = named[i];
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = options[i].name.c_str();
    v.name_size = options[i].name.size();
    v.value_size = 1;
    std::visit(
        [&v](const auto& value) {
          using T = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<T, bool>) {
            v.type = PJRT_NamedValue_kBool;
            v.bool_value = value;
          } else if constexpr (std::is_same_v<T, float>) {
            v.type = PJRT_NamedValue_kFloat;
            v.float_value = value;
          } else if constexpr (std::is_same_v<T, int64_t>) {
            v.type = PJRT_NamedValue_kInt64;
            v.int64_value = value;
          } else {
            v.type = PJRT_NamedValue_kString;
            v.string_value = value.c_str();
            v.value_size = value.size();
          }
        },
        options[i].value);
  }
  return named;
}

Plugin::~Plugin() {
  if (!client) return;
  KILN_PJRT_ARGS(PJRT_Client_Destroy_Args, args);
  args.client = client;
  discard(api, api->PJRT_Client_Destroy(&args));
}

int Plugin::index_of(const PJRT_Device* device) const {
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i] == device) return int(i);
  return -1;
}

std::shared_ptr<Plugin> load_plugin(const std::string& path, const std::vector<ClientOption>& options) {
  auto plugin = std::make_shared<Plugin>();
  plugin->path = path;
  plugin->api = load_api(path);
  const PJRT_Api* api = plugin->api;
  const std::vector<PJRT_NamedValue> named = named_values(options);
  KILN_PJRT_ARGS(PJRT_Client_Create_Args, create);
  create.create_options = named.data();
  create.num_options = named.size();
  check(api, api->PJRT_Client_Create(&create), "PJRT_Client_Create");
  plugin->client = create.client;
  KILN_PJRT_ARGS(PJRT_Client_AddressableDevices_Args, devices);
  devices.client = plugin->client;
  check(api, api->PJRT_Client_AddressableDevices(&devices), "PJRT_Client_AddressableDevices");
  plugin->devices.assign(devices.addressable_devices,
                         devices.addressable_devices + devices.num_addressable_devices);
  return plugin;
}

}  // namespace kiln::pjrt
