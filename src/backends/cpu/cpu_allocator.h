// The CPU device's caching allocator.
//
// Freed blocks are kept in a cache and handed out again to later allocations of the same size class (as
// PyTorch's CPU caching allocator and MLX's buffer cache do): a DiT step allocates the same few shapes
// every block and every step, and a fresh multi-megabyte mmap is page-faulted on first touch (about 12K
// faults for a 48 MB tensor), which costs more than a norm or elementwise kernel over it. Large blocks
// (>= 1 MiB) are mapped 2 MiB-aligned with MADV_HUGEPAGE, so even their first touch takes one fault per
// 2 MiB, and a reused block takes none.
//
// A miss (a size with no cached block) first returns as many cached bytes to the system as it takes, oldest
// blocks first, so the cache recycles memory instead of adding to it: reserved memory stays close to the peak
// of live blocks (on the FLUX-shaped step, weights loaded through float32 temporaries left 1.4 GB of them
// cached before this).
//
// MemoryStats keep meaning "bytes held by live tensors" (current/peak, the bytes asked for);
// reserved_bytes adds what is held from the operating system, live blocks and the cache together.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

#include "kiln/core/allocator.h"

namespace kiln {

class CpuAllocator final : public Allocator {
 public:
  // Blocks at or above this size are mmap'ed 2 MiB-aligned with transparent huge pages.
  static constexpr size_t kLargeBlock = size_t{1} << 20;
  static constexpr size_t kHugePage = size_t{2} << 20;

  // The cache limit from KILN_CPU_CACHE_LIMIT_MB (0 disables caching), else the smaller of 2 GiB and a
  // quarter of physical memory. Throws kiln::Error naming the variable when it is not a number.
  CpuAllocator();
  // `cache_limit_bytes`: the most bytes kept in freed blocks; 0 returns every block to the system at once.
  explicit CpuAllocator(size_t cache_limit_bytes);
  ~CpuAllocator() override;
  CpuAllocator(const CpuAllocator&) = delete;
  CpuAllocator& operator=(const CpuAllocator&) = delete;

  // 64-byte aligned (2 MiB for large blocks); nullptr for 0 bytes. When the system refuses, the cache is
  // released and the allocation retried once before kiln::Error ("cpu: out of memory ...") is thrown.
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  // Returns every cached (free) block to the system.
  void empty_cache() override;

  size_t cache_limit() const { return cache_limit_; }
  // Bytes in freed blocks kept for reuse.
  int64_t cached_bytes() const;
  // The size of the block that serves a request of `bytes` (size classes below 1 MiB, 2 MiB multiples
  // above); what reserved_bytes counts per block.
  static size_t block_size(size_t bytes);
  // Parses a KILN_CPU_CACHE_LIMIT_MB value into bytes; nullptr or "" gives the default.
  static size_t parse_cache_limit(const char* value);

 protected:
  int64_t reserved() const override;

 private:
  struct FreeBlock {
    void* ptr;
    uint64_t age;  // key in by_age_
  };
  using BySize = std::multimap<size_t, FreeBlock>;

  void* take_cached(size_t size);  // under mutex_
  void* system_allocate(size_t size);
  static void system_free(void* ptr, size_t size);
  // Frees cached blocks, oldest first, until at most `target` bytes remain cached; under mutex_.
  void trim_to(size_t target);

  const size_t cache_limit_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, size_t> live_;  // pointer -> block size
  BySize by_size_;                          // cached blocks, best fit by size
  std::map<uint64_t, BySize::iterator> by_age_;
  uint64_t next_age_ = 0;
  size_t cached_ = 0;
  size_t reserved_ = 0;
};

}  // namespace kiln
