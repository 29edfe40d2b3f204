#include <mutex>

#include "kiln/core/error.h"
#include "runtime/backend.h"

namespace kiln::runtime {

const std::vector<Backend*>& backends() {
  // Never destroyed: tensors held by other statics free their storage through the backends' allocators during
  // exit, in whatever order those statics go.
  static std::vector<Backend*>* list = [] {
    auto* made = new std::vector<Backend*>;
    register_builtin_backends(*made);
    return made;
  }();
  return *list;
}

Backend& backend_for(DeviceType type) {
  for (Backend* backend : backends())
    for (DeviceType t : backend->device_types())
      if (t == type) return *backend;
  KILN_FAIL("device type " << device_type_name(type)
                           << " is not available: this build of Kiln has no backend for it");
}

}  // namespace kiln::runtime

namespace kiln {

DeviceRuntime& device_runtime(Device device) {
  return runtime::backend_for(device.type).runtime(device);
}

std::vector<DeviceTypeStatus> available_devices() {
  std::vector<DeviceTypeStatus> out;
  for (runtime::Backend* backend : runtime::backends()) {
    for (DeviceType type : backend->device_types()) {
      DeviceTypeStatus status{type, {}, {}};
      try {
        status.devices = backend->devices(type);
      } catch (const Error& e) {
        status.unavailable_because = e.what();
      }
      out.push_back(std::move(status));
    }
  }
  return out;
}

}  // namespace kiln
