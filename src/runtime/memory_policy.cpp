#include "kiln/runtime/memory_policy.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

#include "kiln/core/error.h"
#include "kiln/runtime/execution_context.h"
#include "runtime/packed_weight_charge.h"
#include "runtime/resident_weights.h"
#include "runtime/weight_group_tracker.h"

namespace kiln {

namespace runtime {

struct PackedAccount {
  static constexpr int64_t kUnlimited = -1;
  std::atomic<int64_t> budget{kUnlimited};
  std::atomic<int64_t> held{0};
};

PackedWeightCharge::PackedWeightCharge(std::shared_ptr<PackedAccount> account, int64_t bytes)
    : account_(std::move(account)), bytes_(bytes) {}

PackedWeightCharge::PackedWeightCharge(PackedWeightCharge&& other) noexcept
    : account_(std::move(other.account_)), bytes_(std::exchange(other.bytes_, 0)) {}

PackedWeightCharge& PackedWeightCharge::operator=(PackedWeightCharge&& other) noexcept {
  if (this != &other) {
    release();
    account_ = std::move(other.account_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PackedWeightCharge::~PackedWeightCharge() {
  release();
}

void PackedWeightCharge::release() {
  if (account_) account_->held.fetch_sub(bytes_);
  account_.reset();
  bytes_ = 0;
}

}  // namespace runtime

namespace {

constexpr int64_t kUnlimited = -1;

// The initial prepacking policy of every context. Its Auto rule comes from cpu-limits.md section 2 (quiet
// host, 2 threads, 4096 x 3072 x {3072, 12288}): bf16 with the weight in place ("ba") 655-675 GFLOP/s
// against 743-753 packed; f32 377-383 against 380-395. bench/matmul.cpp measures the same comparison through
// kiln::linear.
WeightPrepacking prepack_from_env() {
  const char* v = std::getenv("KILN_PREPACK_WEIGHTS");
  if (v == nullptr || *v == '\0') return WeightPrepacking::Auto;
  const std::string s(v);
  KILN_CHECK(s == "auto" || s == "0" || s == "1",
             "KILN_PREPACK_WEIGHTS: expected auto, 0 or 1, got '" << s << "'");
  return s == "auto" ? WeightPrepacking::Auto : s == "1" ? WeightPrepacking::Always : WeightPrepacking::Never;
}

std::optional<int64_t> budget_value(int64_t b) {
  return b == kUnlimited ? std::nullopt : std::optional<int64_t>(b);
}

}  // namespace

struct MemoryPolicy::State {
  std::shared_ptr<runtime::PackedAccount> packed = std::make_shared<runtime::PackedAccount>();
  std::atomic<int> prepack{-1};  // -1: not read from the environment yet
  std::atomic<int64_t> resident_budget{kUnlimited};
  runtime::ResidentWeights resident;
  runtime::WeightGroupTracker groups;
  std::mutex ledgers_mutex;
  std::vector<std::pair<Device, std::shared_ptr<DeviceLedger>>> ledgers;
};

MemoryPolicy::MemoryPolicy() : state_(std::make_unique<State>()) {}

MemoryPolicy::~MemoryPolicy() {
  // Arrays of this context may outlive it and still hold their ledgers; its limits end with it.
  for (auto& [device, ledger] : state_->ledgers) ledger->set_limit(std::nullopt);
}

std::shared_ptr<DeviceLedger> MemoryPolicy::device_ledger(Device device, const std::string& owner,
                                                          bool& made) {
  std::lock_guard<std::mutex> lock(state_->ledgers_mutex);
  made = false;
  for (const auto& [on, ledger] : state_->ledgers)
    if (on == device) return ledger;
  made = true;
  return state_->ledgers.emplace_back(device, std::make_shared<DeviceLedger>(device, owner)).second;
}

void MemoryPolicy::set_packed_weight_budget(std::optional<int64_t> bytes) {
  state_->packed->budget.store(bytes ? std::max<int64_t>(*bytes, 0) : kUnlimited);
}

std::optional<int64_t> MemoryPolicy::packed_weight_budget() const {
  return budget_value(state_->packed->budget.load());
}

int64_t MemoryPolicy::packed_weight_bytes() const {
  return state_->packed->held.load();
}

void MemoryPolicy::set_weight_prepacking(WeightPrepacking policy) {
  state_->prepack.store(static_cast<int>(policy));
}

WeightPrepacking MemoryPolicy::weight_prepacking() const {
  int v = state_->prepack.load();
  if (v < 0) {
    v = static_cast<int>(prepack_from_env());
    state_->prepack.store(v);
  }
  return static_cast<WeightPrepacking>(v);
}

bool MemoryPolicy::weight_is_prepacked(DType dtype) const {
  switch (weight_prepacking()) {
    case WeightPrepacking::Always:
      return true;
    case WeightPrepacking::Never:
      return false;
    case WeightPrepacking::Auto:
      break;
  }
  return dtype == bfloat16;
}

void MemoryPolicy::set_resident_weight_budget(std::optional<int64_t> bytes) {
  state_->resident_budget.store(bytes ? std::max<int64_t>(*bytes, 0) : kUnlimited);
  if (!bytes) state_->resident.clear();
}

std::optional<int64_t> MemoryPolicy::resident_weight_budget() const {
  return budget_value(state_->resident_budget.load());
}

void MemoryPolicy::set_weight_groups(std::vector<WeightGroup> groups, bool prefetch) {
  state_->groups.set(std::move(groups), prefetch);
}

void MemoryPolicy::clear_weight_groups() {
  state_->groups.set({}, false);
}

void MemoryPolicy::stop_weight_prefetch() {
  state_->groups.stop();
}

WeightGroupStats MemoryPolicy::weight_group_stats() const {
  return state_->groups.stats();
}

int MemoryPolicy::weight_group_of(const Storage& storage) const {
  return state_->groups.group_of(storage);
}

uint64_t MemoryPolicy::weight_groups_generation() const {
  return state_->groups.generation();
}

void MemoryPolicy::note_reads(const std::vector<Tensor>& inputs) {
  const bool groups = state_->groups.active();
  const int64_t budget = state_->resident_budget.load(std::memory_order_relaxed);
  if (!groups && budget == kUnlimited) return;
  for (const Tensor& t : inputs) {
    if (!t.defined() || !t.storage()->can_send_out()) continue;  // only offloadable weights come and go
    if (groups) state_->groups.note_read(*t.storage());
    if (budget != kUnlimited) state_->resident.use(t.storage(), budget);
  }
}

runtime::PackedWeightCharge MemoryPolicy::reserve_packed(int64_t bytes) {
  runtime::PackedAccount& account = *state_->packed;
  int64_t held = account.held.load();
  for (;;) {
    const int64_t budget = account.budget.load();
    if (budget != kUnlimited && held + bytes > budget) return {};
    if (account.held.compare_exchange_weak(held, held + bytes)) return {state_->packed, bytes};
  }
}

void set_packed_weight_budget(std::optional<int64_t> bytes) {
  current_context().memory().set_packed_weight_budget(bytes);
}
std::optional<int64_t> packed_weight_budget() {
  return current_context().memory().packed_weight_budget();
}
int64_t packed_weight_bytes() {
  return current_context().memory().packed_weight_bytes();
}
void set_weight_prepacking(WeightPrepacking policy) {
  current_context().memory().set_weight_prepacking(policy);
}
WeightPrepacking weight_prepacking() {
  return current_context().memory().weight_prepacking();
}
bool weight_is_prepacked(DType weight_dtype) {
  return current_context().memory().weight_is_prepacked(weight_dtype);
}
void set_resident_weight_budget(std::optional<int64_t> bytes) {
  current_context().memory().set_resident_weight_budget(bytes);
}
std::optional<int64_t> resident_weight_budget() {
  return current_context().memory().resident_weight_budget();
}
void set_weight_groups(std::vector<WeightGroup> groups, bool prefetch) {
  current_context().memory().set_weight_groups(std::move(groups), prefetch);
}
void clear_weight_groups() {
  current_context().memory().clear_weight_groups();
}
void stop_weight_prefetch() {
  current_context().memory().stop_weight_prefetch();
}
WeightGroupStats weight_group_stats() {
  return current_context().memory().weight_group_stats();
}

}  // namespace kiln
