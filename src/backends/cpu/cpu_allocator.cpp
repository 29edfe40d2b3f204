#include "backends/cpu/cpu_allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.h"

namespace kiln {

namespace {

constexpr size_t kAlignment = 64;  // one cache line, one AVX-512 vector

size_t default_cache_limit() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  const size_t two_gib = size_t{2} << 30;
  if (pages <= 0 || page_size <= 0) return two_gib;
  return std::min(two_gib, static_cast<size_t>(pages) * static_cast<size_t>(page_size) / 4);
}

// A 2 MiB-aligned anonymous mapping of `size` bytes (a multiple of the page size): map 2 MiB more, unmap
// the unaligned head and tail. Aligned so that transparent huge pages can back every whole 2 MiB of it
// where the system uses them for every mapping, or where `huge_pages` asks for them (MADV_HUGEPAGE).
void* map_aligned(size_t size, bool huge_pages) {
  const size_t huge = CpuAllocator::kHugePage;
  void* raw = mmap(nullptr, size + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + huge - 1) / huge * huge;
  if (aligned > base) munmap(raw, aligned - base);
  const uintptr_t end = base + size + huge;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
  void* p = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
  if (huge_pages)
    madvise(p, size, MADV_HUGEPAGE);  // a hint: without THP the block still works with 4 KiB pages
#endif
  return p;
}

// A block of `size` bytes (a whole number of 4 KiB pages) made of the pages of cached blocks (`donors`,
// each a whole number of 2 MiB pages), so that a miss reuses pages the process already has instead of
// taking fresh ones from the system: the kernel zeroes every fresh page on first touch (on this project's
// VMs 0.6 s per GB with 4 KiB pages, 12 s per GB with huge pages; the VAE's decode at 1024^2 spent 49-62% of
// its time there). A donor
// at least as big is cut to size in place; otherwise the donors, largest first, are moved (mremap: page
// tables, no copying) one after the other into a fresh 2 MiB-aligned range, whose remainder gets fresh
// pages on first touch. What is not needed (other donors, the tail of a cut donor from its next 2 MiB
// boundary on) comes back in `leftovers`, still mapped; the block is nullptr when the system refuses the
// range, and every donor is then a leftover.
struct Recycled {
  void* block = nullptr;
  std::vector<std::pair<void*, size_t>> leftovers;
};

Recycled recycle_pages(std::vector<std::pair<void*, size_t>> donors, size_t size, bool huge_pages) {
  constexpr size_t huge = CpuAllocator::kHugePage;
  std::sort(donors.begin(), donors.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  Recycled out;
  // Keeps the first `take` bytes of a donor: the rest up to the next 2 MiB boundary goes back to the
  // system (a long-lived block's size is whole pages), the rest after it stays a cached block.
  auto cut = [&](void* ptr, size_t bytes, size_t take) {
    char* const p = static_cast<char*>(ptr);
    const size_t kept = std::min(bytes, (take + huge - 1) / huge * huge);
    if (kept > take) munmap(p + take, kept - take);
    if (bytes > kept) out.leftovers.emplace_back(p + kept, bytes - kept);
  };
  // The smallest donor that covers the whole block.
  size_t fit = donors.size();
  for (size_t i = 0; i < donors.size() && donors[i].second >= size; ++i) fit = i;
  if (fit < donors.size()) {
    for (size_t i = 0; i < donors.size(); ++i) {
      if (i != fit) {
        out.leftovers.push_back(donors[i]);
        continue;
      }
      out.block = donors[i].first;
      cut(donors[i].first, donors[i].second, size);
    }
    return out;
  }
  out.block = map_aligned(size, huge_pages);
  if (out.block == nullptr) {
    out.leftovers = std::move(donors);
    return out;
  }
  size_t filled = 0;
  for (auto [ptr, bytes] : donors) {
    if (filled == size) {
      out.leftovers.emplace_back(ptr, bytes);
      continue;
    }
    const size_t take = std::min(bytes, size - filled);
    cut(ptr, bytes, take);
    // On failure that part of the block keeps its fresh pages and the donor's go back to the system.
    if (mremap(ptr, take, take, MREMAP_MAYMOVE | MREMAP_FIXED, static_cast<char*>(out.block) + filled) ==
        MAP_FAILED)
      munmap(ptr, take);
    filled += take;
  }
  return out;
}

}  // namespace

size_t CpuAllocator::block_size(size_t bytes) {
  if (bytes == 0) return 0;
  if (bytes >= kLargeBlock) return (bytes + kHugePage - 1) / kHugePage * kHugePage;
  if (bytes <= 512) return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  // Eight classes per power of two: at most 12.5% rounding, few enough classes that blocks get reused.
  const size_t step = std::bit_floor(bytes) / 8;
  return (bytes + step - 1) / step * step;
}

size_t CpuAllocator::parse_cache_limit(const char* value) {
  if (value == nullptr || *value == '\0') return default_cache_limit();
  const std::string text(value);
  size_t used = 0;
  unsigned long long mb = 0;
  try {
    mb = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KILN_CHECK(used == text.size() && text.find('-') == std::string::npos,
             "KILN_CPU_CACHE_LIMIT_MB: expected a whole number of megabytes (0 disables the CPU allocator's "
             "cache), got '"
                 << text << "'");
  return static_cast<size_t>(mb) << 20;
}

bool CpuAllocator::parse_huge_pages(const char* value) {
  if (value == nullptr || *value == '\0') return false;
  const std::string text(value);
  KILN_CHECK(
      text == "0" || text == "1",
      "KILN_CPU_HUGE_PAGES: expected 1 (ask for transparent huge pages) or 0 (do not), got '" << text << "'");
  return text == "1";
}

CpuAllocator::CpuAllocator()
    : CpuAllocator(parse_cache_limit(std::getenv("KILN_CPU_CACHE_LIMIT_MB")),
                   parse_huge_pages(std::getenv("KILN_CPU_HUGE_PAGES"))) {}

CpuAllocator::CpuAllocator(size_t cache_limit_bytes, bool huge_pages)
    : cache_limit_(cache_limit_bytes), huge_pages_(huge_pages) {}

CpuAllocator::~CpuAllocator() {
  empty_cache();
}

size_t CpuAllocator::long_lived_block_size(size_t bytes) {
  if (bytes < kLargeBlock) return block_size(bytes);
  const size_t page = 4096;
  return (bytes + page - 1) / page * page;
}

void* CpuAllocator::system_allocate(size_t size) {
  if (size >= kLargeBlock) return map_aligned(size, huge_pages_);
  return std::aligned_alloc(kAlignment, size);
}

void CpuAllocator::system_free(void* ptr, size_t size) {
  if (size >= kLargeBlock) {
    munmap(ptr, size);
  } else {
    std::free(ptr);
  }
}

void CpuAllocator::note_request(size_t size) {
  ++requests_;
  auto [it, first] = uses_.try_emplace(size, ClassUse{requests_, 0});
  if (first) return;
  it->second.longest_gap = std::max(it->second.longest_gap, requests_ - it->second.last);
  it->second.last = requests_;
}

bool CpuAllocator::idle(size_t size) const {
  const auto it = uses_.find(size);
  if (it == uses_.end()) return true;
  return requests_ - it->second.last > std::max(2 * it->second.longest_gap, kMinIdleRequests);
}

void* CpuAllocator::take_cached(size_t size) {
  // Of equal blocks take the one freed last: its lines are likeliest still in cache.
  auto it = by_size_.upper_bound(size);
  if (it != by_size_.begin() && std::prev(it)->first == size) --it;
  if (it == by_size_.end()) return nullptr;
  // Small blocks match their class exactly; a large request may take a block up to 1/8 bigger, which
  // covers tensors whose sizes differ by a few rows without letting a small tensor pin a huge block.
  const size_t slack = size >= kHugePage ? size / 8 : 0;
  if (it->first > size + slack) return nullptr;
  void* p = it->second.ptr;
  cached_ -= it->first;
  live_.emplace(p, it->first);
  by_age_.erase(it->second.age);
  by_size_.erase(it);
  return p;
}

void* CpuAllocator::allocate(size_t bytes) {
  return allocate_block(bytes, /*long_lived=*/false);
}

void* CpuAllocator::allocate_long_lived(size_t bytes) {
  return allocate_block(bytes, /*long_lived=*/true);
}

void* CpuAllocator::allocate_block(size_t bytes, bool long_lived) {
  if (bytes == 0) {
    record_allocate(0);
    return nullptr;
  }
  const size_t size = long_lived ? long_lived_block_size(bytes) : block_size(bytes);
  std::vector<std::pair<void*, size_t>> donors;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // A long-lived block's size says nothing about which activation sizes recur.
    if (!long_lived) {
      note_request(size);
      if (requests_ % kSweepPeriod == 0) trim_to(0, /*spare_recurring=*/true);
    }
    if (void* p = take_cached(size)) {
      record_allocate(bytes);
      return p;
    }
    // A miss: give back as many cached bytes as are about to be taken from the system, idle blocks first
    // (oldest first), so that blocks of sizes no longer asked for are recycled into this one. In a loop of
    // repeated shapes the blocks whose sizes recur stay and the reservation grows instead, until the loop
    // stops missing. A long-lived block (a weight's packed copy, made once) recycles any cached block:
    // growing for it would keep the cache beside the weights. A large block takes the pages of the large
    // blocks it pushes out (recycle_pages), and what it does not need of them stays cached. A small block
    // only makes room among small ones: freeing a 64 MB block for a few kB made the next 64 MB request
    // miss.
    const bool large = size >= kLargeBlock;
    trim_to(cached_ > size ? cached_ - size : 0, /*spare_recurring=*/!long_lived && repeated_shapes_ > 0,
            large ? &donors : nullptr, large ? SIZE_MAX : kLargeBlock - 1);
  }
  void* p = nullptr;
  if (!donors.empty()) {
    Recycled recycled = recycle_pages(std::move(donors), size, huge_pages_);
    p = recycled.block;
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto [ptr, bytes] : recycled.leftovers) {
      reserved_ += bytes;
      cache_block(ptr, bytes);
    }
    trim_to(cache_limit_);
  }
  if (p == nullptr) p = system_allocate(size);
  if (p == nullptr) {
    // The cache may hold what the system now lacks: give it back and try once more.
    empty_cache();
    p = system_allocate(size);
  }
  KILN_CHECK(p != nullptr, "cpu: out of memory allocating " << bytes << " bytes (" << stats().current_bytes
                                                            << " bytes in use by tensors, " << reserved()
                                                            << " bytes reserved)");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.emplace(p, size);
    reserved_ += size;
    ++system_allocations_;
  }
  record_allocate(bytes);
  return p;
}

void CpuAllocator::deallocate(void* ptr, size_t bytes) {
  free_block(ptr, bytes, /*keep=*/true);
}

void CpuAllocator::release(void* ptr, size_t bytes) {
  free_block(ptr, bytes, /*keep=*/false);
}

void CpuAllocator::free_block(void* ptr, size_t bytes, bool keep) {
  if (ptr == nullptr) {
    record_deallocate(bytes);
    return;
  }
  size_t size = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    KILN_CHECK(it != live_.end(), "cpu allocator: deallocate of " << ptr << " (" << bytes
                                                                  << " bytes), which it did not allocate");
    record_deallocate(bytes);
    size = it->second;
    live_.erase(it);
    if (keep && size <= cache_limit_) {
      cache_block(ptr, size);
      trim_to(cache_limit_);
      return;
    }
    reserved_ -= size;
  }
  system_free(ptr, size);
}

void CpuAllocator::cache_block(void* ptr, size_t size) {
  const uint64_t age = next_age_++;
  auto pos = by_size_.emplace(size, FreeBlock{ptr, age});
  by_age_.emplace(age, pos);
  cached_ += size;
}

void CpuAllocator::trim_to(size_t target, bool spare_recurring, std::vector<std::pair<void*, size_t>>* donors,
                           size_t largest) {
  for (const bool idle_only : {true, false}) {
    if (!idle_only && spare_recurring) return;
    for (auto oldest = by_age_.begin(); cached_ > target && oldest != by_age_.end();) {
      const auto block = oldest->second;
      if (block->first > largest || (idle_only && !idle(block->first))) {
        ++oldest;
        continue;
      }
      if (donors != nullptr && block->first >= kLargeBlock && block->first % kHugePage == 0)
        donors->emplace_back(block->second.ptr, block->first);
      else
        system_free(block->second.ptr, block->first);
      cached_ -= block->first;
      reserved_ -= block->first;
      by_size_.erase(block);
      oldest = by_age_.erase(oldest);
    }
  }
}

void CpuAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  trim_to(0);
}

void CpuAllocator::mark_cache_idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  uses_.clear();
}

void CpuAllocator::enter_repeated_shapes() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++repeated_shapes_;
}

void CpuAllocator::leave_repeated_shapes() {
  std::lock_guard<std::mutex> lock(mutex_);
  --repeated_shapes_;
}

int64_t CpuAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(cached_);
}

int64_t CpuAllocator::system_allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return system_allocations_;
}

int64_t CpuAllocator::reserved() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(reserved_);
}

}  // namespace kiln
