// The CPU device's caching allocator.
//
// Freed blocks are kept in a cache and handed out again to later allocations of the same size class (as
// PyTorch's CPU caching allocator and MLX's buffer cache do): a DiT step allocates the same few shapes
// every block and every step, and a fresh multi-megabyte mmap is page-faulted on first touch (about 12K
// faults for a 48 MB tensor), which costs more than a norm or elementwise kernel over it. Large blocks
// (>= 1 MiB) are mapped 2 MiB-aligned, and a reused block takes no fault.
//
// Which cached blocks go back to the system is decided by how often their size is asked for. Each size
// class remembers when it was last requested (counted in allocate() calls) and the longest gap seen
// between two of its requests. A cached block whose class has gone unrequested for more than twice that
// gap (and at least kMinIdleRequests) is idle: a loader's float32 temporaries, an earlier resolution, a
// one-off tensor. A miss recycles idle blocks first (oldest first, as many bytes as it takes), and a sweep
// every kSweepPeriod requests returns the rest. Then, outside a loop of repeated shapes, a miss recycles the
// oldest other cached blocks too, so reserved memory stays close to the peak of live blocks. Inside one (the
// denoising loop: enter_repeated_shapes), blocks of classes that recur are kept and the reservation grows
// instead: a DiT step frees a 96 MB block it needs again later while it asks for a 48 MB one, and recycling
// by age traded one for the other on every step (about 30 fresh mappings per FLUX-shaped step, 8% of its
// time in clearing new pages). Outside such loops (text encoders, the VAE's decode, which run once per call
// and move through sizes), keeping them would hold every size beside the next. The cache limit bounds what
// is kept either way; mark_cache_idle() makes a finished component's blocks idle at once.
//
// A miss for a large block takes the pages of the large blocks it pushes out of the cache (moved with
// mremap, no copying) rather than fresh ones from the system, and puts back what it does not need: the
// kernel zeroes every fresh page on first touch, and a VAE decode that moves through sizes asked for
// fresh pages worth several times its peak. Transparent huge pages are not requested (KILN_CPU_HUGE_PAGES=1
// asks for them): on the VMs this project runs on a fresh huge page took 12 s per GB to fault in, against
// 0.6 s per GB for 4 KiB pages, and steady-state steps ran no faster with them (docs/performance.md).
//
// MemoryStats keep meaning "bytes held by live tensors" (current/peak, the bytes asked for);
// reserved_bytes adds what is held from the operating system, live blocks and the cache together.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/core/allocator.h"

namespace kiln {

class CpuAllocator final : public Allocator {
 public:
  // Blocks at or above this size are mmap'ed 2 MiB-aligned (and cached ones are multiples of kHugePage).
  static constexpr size_t kLargeBlock = size_t{1} << 20;
  static constexpr size_t kHugePage = size_t{2} << 20;
  // A size class unrequested for this many allocate() calls, and for twice its longest gap, is idle.
  static constexpr uint64_t kMinIdleRequests = 64;
  // How often (in allocate() calls) idle cached blocks are returned to the system.
  static constexpr uint64_t kSweepPeriod = 256;

  // The cache limit from KILN_CPU_CACHE_LIMIT_MB (0 disables caching), else the smaller of 2 GiB and a
  // quarter of physical memory; huge pages when KILN_CPU_HUGE_PAGES=1. Throws kiln::Error naming the
  // variable when either is malformed.
  CpuAllocator();
  // `cache_limit_bytes`: the most bytes kept in freed blocks; 0 returns every block to the system at once.
  // `huge_pages`: ask for transparent huge pages for large blocks (MADV_HUGEPAGE).
  explicit CpuAllocator(size_t cache_limit_bytes, bool huge_pages = false);
  ~CpuAllocator() override;
  CpuAllocator(const CpuAllocator&) = delete;
  CpuAllocator& operator=(const CpuAllocator&) = delete;

  // 64-byte aligned (2 MiB for large blocks); nullptr for 0 bytes. When the system refuses, the cache is
  // released and the allocation retried once before kiln::Error ("cpu: out of memory ...") is thrown.
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  void* allocate_long_lived(size_t bytes) override;
  void release(void* ptr, size_t bytes) override;
  // Returns every cached (free) block to the system.
  void empty_cache() override;
  // Forgets when each size class was requested: until a size is asked for again, its blocks are idle.
  void mark_cache_idle() override;
  void enter_repeated_shapes() override;
  void leave_repeated_shapes() override;

  size_t cache_limit() const { return cache_limit_; }
  // Bytes in freed blocks kept for reuse.
  int64_t cached_bytes() const;
  // The size of the block that serves a request of `bytes` (size classes below 1 MiB, 2 MiB multiples
  // above); what reserved_bytes counts per block.
  static size_t block_size(size_t bytes);
  // The block of a long-lived request: whole 4 KiB pages from 1 MiB up (it is never cached, so a size class
  // would only waste memory: a 1.1 MB weight in a 2 MiB block), else block_size.
  static size_t long_lived_block_size(size_t bytes);
  // Parses a KILN_CPU_CACHE_LIMIT_MB value into bytes; nullptr or "" gives the default.
  static size_t parse_cache_limit(const char* value);
  // Parses a KILN_CPU_HUGE_PAGES value: "1" asks for huge pages, "0", "" or nullptr does not.
  static bool parse_huge_pages(const char* value);

 protected:
  int64_t reserved() const override;
  int64_t system_allocations() const override;

 private:
  struct FreeBlock {
    void* ptr;
    uint64_t age;  // key in by_age_
  };
  using BySize = std::multimap<size_t, FreeBlock>;
  // When a size class was last requested (the value of requests_ then) and the longest gap between two of
  // its requests (0 until it has been asked for twice).
  struct ClassUse {
    uint64_t last = 0;
    uint64_t longest_gap = 0;
  };

  // The following run under mutex_.
  void note_request(size_t size);
  bool idle(size_t size) const;
  // Puts a free block in the cache, newest.
  void cache_block(void* ptr, size_t size);
  void* take_cached(size_t size);
  // Frees cached blocks until at most `target` bytes remain cached: idle ones first (oldest first), then,
  // unless `spare_recurring`, the others (oldest first); with it, fewer bytes may be freed. With `donors`,
  // large blocks (whole 2 MiB pages) leaving the cache are handed there, still mapped, instead of unmapped.
  // Blocks bigger than `largest` stay.
  void trim_to(size_t target, bool spare_recurring = false,
               std::vector<std::pair<void*, size_t>>* donors = nullptr, size_t largest = SIZE_MAX);

  // allocate() and allocate_long_lived(): on a miss, `long_lived` makes room from every cached block, even
  // inside a loop of repeated shapes.
  void* allocate_block(size_t bytes, bool long_lived);
  // deallocate() and release(): `keep` puts the block in the cache (within its limit).
  void free_block(void* ptr, size_t bytes, bool keep);
  void* system_allocate(size_t size);
  static void system_free(void* ptr, size_t size);

  const size_t cache_limit_;
  const bool huge_pages_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, size_t> live_;  // pointer -> block size
  BySize by_size_;                          // cached blocks, best fit by size
  std::map<uint64_t, BySize::iterator> by_age_;
  std::unordered_map<size_t, ClassUse> uses_;  // by block size
  uint64_t next_age_ = 0;
  uint64_t requests_ = 0;    // allocate() calls of nonzero size (not allocate_long_lived())
  int repeated_shapes_ = 0;  // loops of repeated shapes under way
  size_t cached_ = 0;
  size_t reserved_ = 0;
  int64_t system_allocations_ = 0;
};

}  // namespace kiln
