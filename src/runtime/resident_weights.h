// The resident-weight budget's bookkeeping (MemoryPolicy::set_resident_weight_budget): the weights read in
// place from memory-mapped checkpoints, least recently used first. Past the budget the oldest leave the
// process through their device's weight tier (their pages stay in the page cache, from which the next use
// maps them back without a disk read).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kiln/core/storage.h"

namespace kiln::runtime {

class ResidentWeights {
 public:
  // `storage` (file pages) is about to be read: it becomes the most recently used, and the least recently
  // used others are sent out until the rest fit in `budget` (one weight always stays).
  void use(const std::shared_ptr<Storage>& storage, int64_t budget);
  void clear();

 private:
  struct Entry {
    std::weak_ptr<Storage> storage;  // tells a live entry from one whose Storage was freed (address reused)
    const Storage* key;
    int64_t bytes;
  };
  void remove(std::list<Entry>::iterator it);

  std::mutex mutex_;
  std::list<Entry> lru_;
  std::unordered_map<const Storage*, std::list<Entry>::iterator> index_;
  int64_t held_ = 0;
};

}  // namespace kiln::runtime
