// Bytes of packed weight copies charged to a MemoryPolicy's budget (MemoryPolicy::reserve_packed), given back
// when the charge goes: a backend keeps it beside the packed copy it pays for.
#pragma once

#include <cstdint>
#include <memory>

namespace kiln::runtime {

// What a policy has charged: shared by the policy and the charges, so a copy may outlive its context.
struct PackedAccount;

class PackedWeightCharge {
 public:
  PackedWeightCharge() = default;  // empty: holds nothing
  PackedWeightCharge(std::shared_ptr<PackedAccount> account, int64_t bytes);
  PackedWeightCharge(PackedWeightCharge&& other) noexcept;
  PackedWeightCharge& operator=(PackedWeightCharge&& other) noexcept;
  PackedWeightCharge(const PackedWeightCharge&) = delete;
  PackedWeightCharge& operator=(const PackedWeightCharge&) = delete;
  ~PackedWeightCharge();

  explicit operator bool() const { return account_ != nullptr; }

 private:
  void release();
  std::shared_ptr<PackedAccount> account_;
  int64_t bytes_ = 0;
};

}  // namespace kiln::runtime
