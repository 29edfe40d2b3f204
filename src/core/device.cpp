#include "kiln/core/device.h"

#include <charconv>

#include "kiln/core/error.h"

namespace kiln {

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
  if (kind == "cpu")
    type = DeviceType::CPU;
  else if (kind == "cuda")
    type = DeviceType::CUDA;
  else
    KILN_FAIL("unknown device '" << spec << "': expected cpu, cpu:N, cuda or cuda:N");
  index = idx;
}

std::string Device::str() const {
  std::string s = type == DeviceType::CPU ? "cpu" : "cuda";
  if (index != 0 || type != DeviceType::CPU) s += ":" + std::to_string(index);
  return s;
}

}  // namespace kiln
