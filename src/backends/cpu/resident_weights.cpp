#include "backends/cpu/resident_weights.h"

#include <atomic>
#include <list>
#include <mutex>
#include <unordered_map>

#include "kiln/core/device_runtime.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/weight_groups.h"

namespace kiln {

namespace {

constexpr int64_t kUnlimited = -1;
std::atomic<int64_t> g_budget{kUnlimited};

// Least recently used first. Keyed by the Storage's address; the weak pointer tells a live entry from one
// whose Storage was freed (and whose address may have been reused).
class ResidentWeights {
 public:
  static ResidentWeights& instance() {
    static ResidentWeights* weights = new ResidentWeights;  // never destroyed: kernels may run at exit
    return *weights;
  }

  void use(const std::shared_ptr<Storage>& storage, int64_t budget) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(storage.get());
    if (it != index_.end() && it->second->storage.lock() == storage) {
      lru_.splice(lru_.end(), lru_, it->second);
    } else {
      if (it != index_.end()) remove(it->second);
      lru_.push_back({storage, storage.get(), static_cast<int64_t>(storage->bytes())});
      index_[storage.get()] = std::prev(lru_.end());
      held_ += static_cast<int64_t>(storage->bytes());
    }
    while (held_ > budget && lru_.size() > 1) {
      const auto oldest = lru_.begin();
      if (const auto s = oldest->storage.lock()) device_runtime(s->device()).weight_tier().send_out(*s);
      remove(oldest);
    }
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    lru_.clear();
    index_.clear();
    held_ = 0;
  }

 private:
  struct Entry {
    std::weak_ptr<Storage> storage;
    const Storage* key;
    int64_t bytes;
  };

  void remove(std::list<Entry>::iterator it) {
    held_ -= it->bytes;
    index_.erase(it->key);
    lru_.erase(it);
  }

  std::mutex mutex_;
  std::list<Entry> lru_;
  std::unordered_map<const Storage*, std::list<Entry>::iterator> index_;
  int64_t held_ = 0;
};

}  // namespace

void set_resident_weight_budget(std::optional<int64_t> bytes) {
  g_budget.store(bytes ? std::max<int64_t>(*bytes, 0) : kUnlimited);
  if (!bytes) ResidentWeights::instance().clear();
}

std::optional<int64_t> resident_weight_budget() {
  const int64_t b = g_budget.load();
  return b == kUnlimited ? std::nullopt : std::optional<int64_t>(b);
}

namespace cpu_kernels {

void use_resident_weight(const Tensor& weight) {
  runtime::note_weight_read(*weight.storage());
  const int64_t budget = g_budget.load();
  if (budget == kUnlimited || !weight.storage()->is_file_pages()) return;
  ResidentWeights::instance().use(weight.storage(), budget);
}

}  // namespace cpu_kernels

}  // namespace kiln
