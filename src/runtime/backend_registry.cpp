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

void Backend::run_region(const DeviceRegion& region) {
  KILN_FAIL("internal: the " << name() << " backend was given " << region.describe()
                             << " to run as one program, but it accepts no calls into regions");
}

std::string DeviceRegion::describe() const {
  std::string s = "region[";
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) s += ", ";
    s += calls[i].op;
  }
  s += "] on " + device().str() + " -> ";
  bool any = false;
  for (size_t i = 0; i < calls.size(); ++i)
    for (size_t o = 0; o < calls[i].outputs.size(); ++o) {
      if (!stored[i][o]) continue;
      const Tensor& t = calls[i].outputs[o];
      s += std::string(any ? ", " : "") + std::string(dtype_name(t.dtype())) + shape_str(t.shape());
      any = true;
    }
  return any ? s : s + "nothing stored";
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
