#include "kiln/core/device.h"

#include <array>
#include <charconv>
#include <utility>

#include "kiln/core/error.h"

namespace kiln {

namespace {

constexpr std::array<std::pair<DeviceType, std::string_view>, 4> kDeviceTypeNames{{
    {DeviceType::CPU, "cpu"},
    {DeviceType::CUDA, "cuda"},
    {DeviceType::TPU, "tpu"},
    {DeviceType::XlaCpu, "xla-cpu"},
}};

}  // namespace

std::string_view device_type_name(DeviceType type) {
  for (const auto& [t, name] : kDeviceTypeNames)
    if (t == type) return name;
  return "unknown";
}

Device::Device(std::string_view spec) {
  std::string_view kind = spec;
  int idx = 0;
  if (auto colon = spec.find(':'); colon != std::string_view::npos) {
    kind = spec.substr(0, colon);
    std::string_view num = spec.substr(colon + 1);
    auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), idx);
    KILN_CHECK(ec == std::errc() && ptr == num.data() + num.size() && idx >= 0,
               "invalid device '" << spec << "': expected an index >= 0 after ':'");
  }
  for (const auto& [t, name] : kDeviceTypeNames) {
    if (kind != name) continue;
    type = t;
    index = idx;
    return;
  }
  KILN_FAIL("unknown device '" << spec << "': expected cpu, cuda, tpu or xla-cpu, each optionally with ':N'");
}

std::string Device::str() const {
  std::string s(device_type_name(type));
  if (index != 0 || type != DeviceType::CPU) s += ":" + std::to_string(index);
  return s;
}

}  // namespace kiln
