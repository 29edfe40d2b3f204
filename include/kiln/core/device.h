// A Device names where memory lives and kernels run: a type and an index ("cpu", "xla-cpu:1", "cuda:0").
// Each device owns an Allocator (with byte counters) and ordered Streams; see device_runtime.h. Which backend
// drives each type is the runtime's business (runtime/backend_registry.h): Kiln's own kernels drive "cpu";
// PJRT plugins drive "cuda", "tpu" and "xla-cpu" (XLA's CPU compiler, which CI uses to test the PJRT path).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

enum class DeviceType : uint8_t { CPU, CUDA, TPU, XlaCpu };

// "cpu", "cuda", "tpu", "xla-cpu": the names Device parses and prints.
std::string_view device_type_name(DeviceType type);

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}
  // Parses "cpu", "cpu:0", "cuda", "cuda:1", "tpu:3", "xla-cpu:2"; throws kiln::Error for anything else.
  explicit Device(std::string_view spec);

  std::string str() const;
  friend constexpr bool operator==(const Device&, const Device&) = default;
};

inline constexpr Device cpu{DeviceType::CPU, 0};

}  // namespace kiln
