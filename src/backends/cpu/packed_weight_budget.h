// Accounting of the packed weight copies against the budget set by kiln::set_packed_weight_budget.
#pragma once

#include <cstdint>

namespace kiln::cpu_kernels {

// Bytes charged to the packed-weight budget, released when this is destroyed. Empty (holding nothing) when
// default-constructed or moved from.
class PackedWeightCharge {
 public:
  PackedWeightCharge() = default;
  // Charges `bytes` when they fit in what the budget has left; an empty charge when they do not.
  static PackedWeightCharge reserve(int64_t bytes);
  PackedWeightCharge(PackedWeightCharge&& other) noexcept : bytes_(other.bytes_) { other.bytes_ = -1; }
  PackedWeightCharge& operator=(PackedWeightCharge&& other) noexcept;
  PackedWeightCharge(const PackedWeightCharge&) = delete;
  PackedWeightCharge& operator=(const PackedWeightCharge&) = delete;
  ~PackedWeightCharge();

  explicit operator bool() const { return bytes_ >= 0; }

 private:
  explicit PackedWeightCharge(int64_t bytes) : bytes_(bytes) {}
  int64_t bytes_ = -1;  // -1: nothing charged
};

}  // namespace kiln::cpu_kernels
