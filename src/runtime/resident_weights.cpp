#include "runtime/resident_weights.h"

#include "kiln/core/device_runtime.h"

namespace kiln::runtime {

void ResidentWeights::use(const std::shared_ptr<Storage>& storage, int64_t budget) {
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

void ResidentWeights::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  lru_.clear();
  index_.clear();
  held_ = 0;
}

void ResidentWeights::remove(std::list<Entry>::iterator it) {
  held_ -= it->bytes;
  index_.erase(it->key);
  lru_.erase(it);
}

}  // namespace kiln::runtime
