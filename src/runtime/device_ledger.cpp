#include "kiln/runtime/device_ledger.h"

#include <vector>

#include "kiln/core/allocator.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"
#include "kiln/runtime/execution_context.h"

namespace kiln {

namespace {

// Every ledger made, for total_memory_limit (expired ones are dropped as they are met).
struct Ledgers {
  std::mutex mutex;
  std::vector<std::weak_ptr<DeviceLedger>> all;
};

Ledgers& ledgers() {
  static Ledgers* l = new Ledgers;  // never destroyed: arrays freed at exit still release into ledgers
  return *l;
}

}  // namespace

DeviceLedger::DeviceLedger(Device device, std::string owner) : device_(device), owner_(std::move(owner)) {}

bool DeviceLedger::charge(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (limit_ && held_ + bytes > *limit_) return false;
  held_ += bytes;
  return true;
}

void DeviceLedger::release(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  held_ -= bytes;
}

int64_t DeviceLedger::held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_;
}

void DeviceLedger::set_limit(std::optional<int64_t> bytes) {
  KILN_CHECK(!bytes || *bytes > 0, "a memory limit must be positive, got " << *bytes << " bytes");
  std::lock_guard<std::mutex> lock(mutex_);
  limit_ = bytes;
}

std::optional<int64_t> DeviceLedger::limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return limit_;
}

std::shared_ptr<DeviceLedger> current_device_ledger(Device device) {
  ExecutionContext& context = current_context();
  bool made = false;
  std::shared_ptr<DeviceLedger> ledger = context.memory().device_ledger(device, context.name(), made);
  if (made) {
    Ledgers& l = ledgers();
    std::lock_guard<std::mutex> lock(l.mutex);
    l.all.push_back(ledger);
  }
  return ledger;
}

void set_memory_limit(Device device, std::optional<int64_t> bytes) {
  KILN_CHECK(
      !bytes || device_runtime(device).allocator().limits_memory(),
      device.str() << ": a memory limit of " << *bytes
                   << " bytes: this device's memory is the host's, which Kiln does not limit (on the cpu, "
                      "--max-memory picks the offload instead)");
  current_device_ledger(device)->set_limit(bytes);
}

std::optional<int64_t> memory_limit(Device device) {
  return current_device_ledger(device)->limit();
}

std::optional<int64_t> total_memory_limit(Device device) {
  Ledgers& l = ledgers();
  std::lock_guard<std::mutex> lock(l.mutex);
  std::optional<int64_t> total;
  std::erase_if(l.all, [](const std::weak_ptr<DeviceLedger>& w) { return w.expired(); });
  for (const std::weak_ptr<DeviceLedger>& w : l.all)
    if (const std::shared_ptr<DeviceLedger> ledger = w.lock(); ledger && ledger->device() == device)
      if (const std::optional<int64_t> limit = ledger->limit()) total = total.value_or(0) + *limit;
  return total;
}

}  // namespace kiln
