#include "backends/cpu/packed_weight_budget.h"

#include <atomic>
#include <utility>

#include "kiln/ops/linalg.h"

namespace kiln {

namespace {

constexpr int64_t kUnlimited = -1;
std::atomic<int64_t> g_budget{kUnlimited};
std::atomic<int64_t> g_held{0};

}  // namespace

void set_packed_weight_budget(std::optional<int64_t> bytes) {
  g_budget.store(bytes ? std::max<int64_t>(*bytes, 0) : kUnlimited);
}

std::optional<int64_t> packed_weight_budget() {
  const int64_t b = g_budget.load();
  return b == kUnlimited ? std::nullopt : std::optional<int64_t>(b);
}

int64_t packed_weight_bytes() {
  return g_held.load();
}

namespace cpu_kernels {

PackedWeightCharge PackedWeightCharge::reserve(int64_t bytes) {
  int64_t held = g_held.load();
  for (;;) {
    const int64_t budget = g_budget.load();
    if (budget != kUnlimited && held + bytes > budget) return {};
    if (g_held.compare_exchange_weak(held, held + bytes)) return PackedWeightCharge(bytes);
  }
}

PackedWeightCharge& PackedWeightCharge::operator=(PackedWeightCharge&& other) noexcept {
  if (this != &other) {
    if (bytes_ > 0) g_held.fetch_sub(bytes_);
    bytes_ = std::exchange(other.bytes_, -1);
  }
  return *this;
}

PackedWeightCharge::~PackedWeightCharge() {
  if (bytes_ > 0) g_held.fetch_sub(bytes_);
}

}  // namespace cpu_kernels

}  // namespace kiln
