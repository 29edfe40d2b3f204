// A Device names where memory lives and kernels run: a type and an index ("cpu", later "cuda:1").
// Each device owns an Allocator (with byte counters) and an ordered Stream; see device_runtime.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}
  // Parses "cpu", "cpu:0", "cuda", "cuda:1"; throws kiln::Error for anything else.
  explicit Device(std::string_view spec);

  std::string str() const;
  friend constexpr bool operator==(const Device&, const Device&) = default;
};

inline constexpr Device cpu{DeviceType::CPU, 0};

}  // namespace kiln
