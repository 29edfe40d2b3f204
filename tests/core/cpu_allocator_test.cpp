#include "backends/cpu/cpu_allocator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "kiln/core/device_runtime.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor.h"
#include "kiln/runtime/execution_context.h"

namespace kiln {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

bool aligned_to(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

TEST(CpuAllocator, BlockSizesAreClassesBelowOneMiBAndHugePageMultiplesAbove) {
  EXPECT_EQ(CpuAllocator::block_size(0), 0u);
  EXPECT_EQ(CpuAllocator::block_size(1), 64u);
  EXPECT_EQ(CpuAllocator::block_size(64), 64u);
  EXPECT_EQ(CpuAllocator::block_size(65), 128u);
  EXPECT_EQ(CpuAllocator::block_size(512), 512u);
  EXPECT_EQ(CpuAllocator::block_size(513), 576u);        // 512 + 512/8
  EXPECT_EQ(CpuAllocator::block_size(100000), 106496u);  // 65536 + 5 * 8192
  EXPECT_EQ(CpuAllocator::block_size(kMiB - 1), kMiB);
  EXPECT_EQ(CpuAllocator::block_size(kMiB), 2 * kMiB);
  EXPECT_EQ(CpuAllocator::block_size(48 * kMiB + 1), 50 * kMiB);
  for (size_t bytes = 1; bytes < 3 * kMiB; bytes = bytes * 3 / 2 + 7) {
    const size_t block = CpuAllocator::block_size(bytes);
    EXPECT_GE(block, bytes);
    EXPECT_EQ(block % 64, 0u);
    if (bytes > 512 && bytes < kMiB) {
      EXPECT_LE(block, bytes + bytes / 8 + 64) << bytes;
    }
  }
}

TEST(CpuAllocator, FreedBlockIsReusedForTheSameSize) {
  for (size_t bytes : {size_t{100}, size_t{100000}, 3 * kMiB + 5, 48 * kMiB}) {
    CpuAllocator a(256 * kMiB);
    void* p = a.allocate(bytes);
    std::memset(p, 1, bytes);
    a.deallocate(p, bytes);
    EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(CpuAllocator::block_size(bytes)));
    void* q = a.allocate(bytes);
    EXPECT_EQ(q, p) << bytes;
    EXPECT_EQ(a.cached_bytes(), 0);
    a.deallocate(q, bytes);
  }
}

TEST(CpuAllocator, LargeBlockMayServeASlightlySmallerRequestButNotAMuchSmallerOne) {
  CpuAllocator a(256 * kMiB);
  void* big = a.allocate(40 * kMiB);
  void* small = a.allocate(8 * kMiB);
  a.deallocate(big, 40 * kMiB);
  void* near = a.allocate(36 * kMiB);  // within 1/8
  EXPECT_EQ(near, big);
  a.deallocate(small, 8 * kMiB);
  std::memset(small, 7, 8 * kMiB);    // (still mapped: cached) what the next block will find in its pages
  void* tiny = a.allocate(2 * kMiB);  // an 8 MiB block would waste 3/4 of itself: a miss
  // The miss took its pages from the cached 8 MiB block, cut in place: no fresh page, and the other 6 MiB
  // stay cached as a block of their own. 40 + 8 MiB reserved, as before the miss.
  EXPECT_EQ(tiny, small);
  EXPECT_EQ(static_cast<unsigned char*>(tiny)[2 * kMiB - 1], 7);
  const MemoryStats s = a.stats();
  EXPECT_EQ(s.current_bytes, static_cast<int64_t>(38 * kMiB));
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(48 * kMiB));
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(6 * kMiB));
  void* rest = a.allocate(6 * kMiB);
  EXPECT_EQ(rest, static_cast<char*>(small) + 2 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(48 * kMiB));
  a.deallocate(near, 36 * kMiB);
  a.deallocate(tiny, 2 * kMiB);
  a.deallocate(rest, 6 * kMiB);
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(48 * kMiB));
}

TEST(CpuAllocator, AMissForABiggerBlockMovesThePagesOfTheBlocksItPushesOut) {
  CpuAllocator a(256 * kMiB);
  unsigned char* p4 = static_cast<unsigned char*>(a.allocate(4 * kMiB));
  unsigned char* p6 = static_cast<unsigned char*>(a.allocate(6 * kMiB));
  std::memset(p4, 4, 4 * kMiB);
  std::memset(p6, 6, 6 * kMiB);
  a.deallocate(p4, 4 * kMiB);
  a.deallocate(p6, 6 * kMiB);
  // 16 MiB: no cached block covers it. Outside a loop of repeated shapes both blocks leave the cache, and
  // their pages (largest first) become the first 10 MiB of the new block; the last 6 MiB are fresh.
  unsigned char* q = static_cast<unsigned char*>(a.allocate(16 * kMiB));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % CpuAllocator::kHugePage, 0u);
  EXPECT_EQ(q[0], 6);
  EXPECT_EQ(q[6 * kMiB - 1], 6);
  EXPECT_EQ(q[6 * kMiB], 4);
  EXPECT_EQ(q[10 * kMiB - 1], 4);
  EXPECT_EQ(q[10 * kMiB], 0);
  EXPECT_EQ(q[16 * kMiB - 1], 0);
  EXPECT_EQ(a.cached_bytes(), 0);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(16 * kMiB));
  std::memset(q, 1, 16 * kMiB);  // every page of it is writable
  a.deallocate(q, 16 * kMiB);
  // A long-lived block (whole 4 KiB pages) cut from a cached one: the cut ends on the next 2 MiB boundary,
  // and the rest stays cached, 2 MiB-aligned.
  void* w = a.allocate_long_lived(3 * kMiB + 4096);
  EXPECT_EQ(w, q);
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(12 * kMiB));
  void* next = a.allocate(12 * kMiB);
  EXPECT_EQ(next, q + 4 * kMiB);
  a.deallocate(next, 12 * kMiB);
  a.release(w, 3 * kMiB + 4096);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(12 * kMiB));
}

TEST(CpuAllocator, ASmallMissDoesNotPushOutALargeBlock) {
  CpuAllocator a(256 * kMiB);
  void* big = a.allocate(64 * kMiB);
  a.deallocate(big, 64 * kMiB);
  void* small = a.allocate(100);  // a miss: nothing small is cached
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(64 * kMiB));
  EXPECT_EQ(a.allocate(64 * kMiB), big);
  a.deallocate(big, 64 * kMiB);
  a.deallocate(small, 100);
}

TEST(CpuAllocator, HugePagesAreAskedForOnlyWhenTheVariableSaysSo) {
  EXPECT_FALSE(CpuAllocator::parse_huge_pages(nullptr));
  EXPECT_FALSE(CpuAllocator::parse_huge_pages(""));
  EXPECT_FALSE(CpuAllocator::parse_huge_pages("0"));
  EXPECT_TRUE(CpuAllocator::parse_huge_pages("1"));
  try {
    CpuAllocator::parse_huge_pages("yes");
    ADD_FAILURE() << "expected an error";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_CPU_HUGE_PAGES"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'yes'"), std::string::npos) << e.what();
  }
  // Either way large blocks work and stay 2 MiB-aligned.
  for (bool huge : {false, true}) {
    CpuAllocator a(256 * kMiB, huge);
    void* p = a.allocate(5 * kMiB);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % CpuAllocator::kHugePage, 0u);
    std::memset(p, 1, 5 * kMiB);
    a.deallocate(p, 5 * kMiB);
  }
}

// Asks for and frees a 100-byte block `times` times: allocate() calls that hit the cache, so that other
// size classes age without anything else changing.
void tick(CpuAllocator& a, uint64_t times) {
  for (uint64_t i = 0; i < times; ++i) a.deallocate(a.allocate(100), 100);
}

TEST(CpuAllocator, MissRecyclesIdleBlocksBeforeOthersSoReservedDoesNotGrow) {
  CpuAllocator a(256 * kMiB);
  const auto small = static_cast<int64_t>(CpuAllocator::block_size(100));
  // Two sizes asked for once (a loader's temporaries, freed last), one asked for all along (freed earlier),
  // in a loop of repeated shapes (outside one, the 100-byte ticks' first miss would recycle the 8 MiB block).
  a.enter_repeated_shapes();
  void* p1 = a.allocate(4 * kMiB);
  void* p2 = a.allocate(6 * kMiB);
  void* p3 = nullptr;
  for (uint64_t i = 0; i < CpuAllocator::kMinIdleRequests; ++i) {
    p3 = a.allocate(8 * kMiB);
    a.deallocate(p3, 8 * kMiB);
    tick(a, 1);
  }
  a.deallocate(p1, 4 * kMiB);
  a.deallocate(p2, 6 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(18 * kMiB) + small);
  // 10 MiB: no block fits. The idle 4 and 6 MiB blocks are released to make room although they were freed
  // after the 8 MiB one, which stays cached.
  void* q = a.allocate(10 * kMiB);
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(8 * kMiB) + small);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(18 * kMiB) + small);
  void* r = a.allocate(8 * kMiB);  // the kept block
  EXPECT_EQ(r, p3);
  // With nothing idle cached, a miss outside a loop of repeated shapes recycles what is cached: the 100-byte
  // block goes, and the reservation grows by the rest.
  a.leave_repeated_shapes();
  void* t = a.allocate(2 * kMiB);
  EXPECT_EQ(a.cached_bytes(), 0);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(20 * kMiB));
  a.deallocate(q, 10 * kMiB);
  a.deallocate(r, 8 * kMiB);
  a.deallocate(t, 2 * kMiB);
}

// A step that frees a 48 MB block before it asks for a 96 MB one, and frees that before a 10 MB one, 20
// times.
int64_t fresh_allocations_of_twenty_steps(CpuAllocator& a) {
  const int64_t before = a.stats().system_allocations;
  for (int step = 0; step < 20; ++step) {
    for (size_t bytes : {48 * kMiB, 96 * kMiB, 10 * kMiB}) {
      void* p = a.allocate(bytes);
      static_cast<unsigned char*>(p)[bytes - 1] = 1;
      a.deallocate(p, bytes);
    }
  }
  return a.stats().system_allocations - before;
}

TEST(CpuAllocator, ALoopOfRepeatedShapesStopsMissingEvenWhenTheyAreNeverLiveTogether) {
  // Outside such a loop every miss recycles the cached block the next request needs: all 60 miss (each
  // takes the pages of the block it pushes out, and puts back what it does not need), and the reservation
  // stays that of the largest block.
  CpuAllocator lean(256 * kMiB);
  EXPECT_EQ(fresh_allocations_of_twenty_steps(lean), 60);
  EXPECT_EQ(lean.stats().reserved_bytes, static_cast<int64_t>(96 * kMiB));
  // Inside, the three sizes recur: after the first step nothing misses.
  CpuAllocator a(256 * kMiB);
  a.enter_repeated_shapes();
  EXPECT_EQ(fresh_allocations_of_twenty_steps(a), 3);
  EXPECT_EQ(a.stats().allocations, 60);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(154 * kMiB));
  // Once the loop has ended (a component ran), its blocks are idle and go back at the next sweep.
  a.leave_repeated_shapes();
  a.mark_cache_idle();
  tick(a, CpuAllocator::kSweepPeriod);
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(CpuAllocator::block_size(100)));
}

TEST(CpuAllocator, IdleBlocksAreReturnedWithoutWaitingForAMiss) {
  CpuAllocator a(256 * kMiB);
  const auto small = static_cast<int64_t>(CpuAllocator::block_size(100));
  a.enter_repeated_shapes();  // no miss recycles anything that is not idle: the sweep alone returns blocks
  // A loader's float32 temporaries: the same 12 MiB size many times in a row, then never again.
  for (int weight = 0; weight < 10; ++weight) {
    void* p = a.allocate(12 * kMiB);
    a.deallocate(p, 12 * kMiB);
  }
  void* held = a.allocate(3 * kMiB);  // asked for once, still live: not the cache's to return
  tick(a, CpuAllocator::kMinIdleRequests);
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(12 * kMiB) + small);  // not idle for long yet
  tick(a, CpuAllocator::kSweepPeriod);
  EXPECT_EQ(a.cached_bytes(), small);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(4 * kMiB) + small);
  a.deallocate(held, 3 * kMiB);
  EXPECT_EQ(a.stats().system_allocations, 3);
  a.leave_repeated_shapes();
}

TEST(CpuAllocator, LongLivedBlocksMakeRoomInTheCacheAndGoBackToTheSystemWhenReleased) {
  // A weight's packed copy, made after the text encoder ran: it recycles the encoder's cached activations
  // even though their sizes were asked for moments ago, and when offload drops it the memory goes back.
  CpuAllocator a(256 * kMiB);
  // Whole pages, not a 2 MiB class: a long-lived block is never cached for another size.
  EXPECT_EQ(CpuAllocator::long_lived_block_size(kMiB + 1), kMiB + 4096);
  EXPECT_EQ(CpuAllocator::long_lived_block_size(100), CpuAllocator::block_size(100));
  void* odd = a.allocate_long_lived(kMiB + 100);
  EXPECT_TRUE(aligned_to(odd, CpuAllocator::kHugePage));
  std::memset(odd, 1, kMiB + 100);
  a.release(odd, kMiB + 100);
  EXPECT_EQ(a.stats().reserved_bytes, 0);
  for (int layer = 0; layer < 4; ++layer) {
    void* x = a.allocate(6 * kMiB);
    void* y = a.allocate(8 * kMiB);
    a.deallocate(x, 6 * kMiB);
    a.deallocate(y, 8 * kMiB);
  }
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(14 * kMiB));
  void* packed = a.allocate_long_lived(20 * kMiB);
  EXPECT_EQ(a.cached_bytes(), 0);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(20 * kMiB));
  void* activation = a.allocate(6 * kMiB);  // an activation's miss keeps recurring sizes instead
  a.deallocate(activation, 6 * kMiB);
  a.release(packed, 20 * kMiB);
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(6 * kMiB));
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(6 * kMiB));
  EXPECT_EQ(a.stats().current_bytes, 0);
  EXPECT_THROW(a.release(packed, 20 * kMiB), Error);  // no longer its to release
}

TEST(CpuAllocator, AlignmentIs64BytesAndHugePageForLargeBlocks) {
  CpuAllocator a(64 * kMiB);
  std::vector<std::pair<void*, size_t>> blocks;
  for (size_t bytes : {size_t{1}, size_t{3}, size_t{63}, size_t{65}, size_t{1000}, size_t{4097},
                       size_t{777777}, kMiB, 5 * kMiB + 3}) {
    void* p = a.allocate(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(aligned_to(p, 64)) << bytes;
    if (bytes >= CpuAllocator::kLargeBlock) {
      EXPECT_TRUE(aligned_to(p, CpuAllocator::kHugePage)) << bytes;
    }
    std::memset(p, 0xab, bytes);  // the whole request is writable
    blocks.emplace_back(p, bytes);
  }
  for (auto [p, bytes] : blocks) a.deallocate(p, bytes);
}

TEST(CpuAllocator, StatsCountLiveBytesAndReservedCountsBlocksAndCache) {
  CpuAllocator a(256 * kMiB);
  const size_t sizes[] = {100, 5000, 3 * kMiB + 1};
  std::vector<void*> ptrs;
  int64_t live = 0, blocks = 0;
  for (size_t s : sizes) {
    ptrs.push_back(a.allocate(s));
    live += static_cast<int64_t>(s);
    blocks += static_cast<int64_t>(CpuAllocator::block_size(s));
  }
  MemoryStats st = a.stats();
  EXPECT_EQ(st.current_bytes, live);
  EXPECT_EQ(st.peak_bytes, live);
  EXPECT_EQ(st.allocations, 3);
  EXPECT_EQ(st.reserved_bytes, blocks);

  a.deallocate(ptrs[2], sizes[2]);
  st = a.stats();
  EXPECT_EQ(st.current_bytes, live - static_cast<int64_t>(sizes[2]));
  EXPECT_EQ(st.peak_bytes, live);
  EXPECT_EQ(st.reserved_bytes, blocks);  // the freed block stays cached
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(CpuAllocator::block_size(sizes[2])));

  void* again = a.allocate(sizes[2]);  // a cache hit is still an allocation of live bytes
  st = a.stats();
  EXPECT_EQ(st.current_bytes, live);
  EXPECT_EQ(st.allocations, 4);
  EXPECT_EQ(st.reserved_bytes, blocks);
  a.deallocate(again, sizes[2]);
  a.deallocate(ptrs[0], sizes[0]);
  a.deallocate(ptrs[1], sizes[1]);
  st = a.stats();
  EXPECT_EQ(st.current_bytes, 0);
  EXPECT_EQ(st.reserved_bytes, blocks);
  EXPECT_EQ(a.cached_bytes(), blocks);

  a.empty_cache();
  st = a.stats();
  EXPECT_EQ(st.reserved_bytes, 0);
  EXPECT_EQ(a.cached_bytes(), 0);
  EXPECT_EQ(st.peak_bytes, live);
}

TEST(CpuAllocator, CacheLimitIsRespectedOldestBlocksGoFirst) {
  CpuAllocator a(10 * kMiB);
  void* p1 = a.allocate(4 * kMiB);
  void* p2 = a.allocate(4 * kMiB);
  void* p3 = a.allocate(4 * kMiB);
  void* big = a.allocate(12 * kMiB);  // bigger than the whole cache: never cached
  a.deallocate(big, 12 * kMiB);
  EXPECT_EQ(a.cached_bytes(), 0);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(12 * kMiB));
  a.deallocate(p1, 4 * kMiB);
  a.deallocate(p2, 4 * kMiB);
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(8 * kMiB));
  a.deallocate(p3, 4 * kMiB);  // 12 MiB > 10 MiB: p1, the oldest, is released
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(8 * kMiB));
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(8 * kMiB));
  // The newest equal block comes back first; the third request maps a fresh one.
  void* q1 = a.allocate(4 * kMiB);
  void* q2 = a.allocate(4 * kMiB);
  EXPECT_EQ(q1, p3);
  EXPECT_EQ(q2, p2);
  void* q3 = a.allocate(4 * kMiB);
  EXPECT_EQ(a.cached_bytes(), 0);
  for (void* q : {q1, q2, q3}) a.deallocate(q, 4 * kMiB);
  EXPECT_LE(a.cached_bytes(), static_cast<int64_t>(10 * kMiB));
}

TEST(CpuAllocator, ZeroLimitDisablesCaching) {
  CpuAllocator a(0);
  void* p = a.allocate(3 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(4 * kMiB));
  a.deallocate(p, 3 * kMiB);
  void* s = a.allocate(100);
  a.deallocate(s, 100);
  EXPECT_EQ(a.cached_bytes(), 0);
  EXPECT_EQ(a.stats().reserved_bytes, 0);
  EXPECT_EQ(a.stats().current_bytes, 0);
}

TEST(CpuAllocator, ZeroSizeAllocationIsNullAndCounted) {
  CpuAllocator a(kMiB);
  void* p = a.allocate(0);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(a.stats().allocations, 1);
  EXPECT_EQ(a.stats().reserved_bytes, 0);
  a.deallocate(p, 0);
  EXPECT_EQ(a.stats().current_bytes, 0);
  EXPECT_EQ(a.cached_bytes(), 0);
}

TEST(CpuAllocator, OutOfMemoryIsAClearError) {
  CpuAllocator a(kMiB);
  try {
    a.allocate(size_t{1} << 62);
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu: out of memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.stats().current_bytes, 0);
  EXPECT_EQ(a.stats().reserved_bytes, 0);
}

TEST(CpuAllocator, ForeignPointerIsRejected) {
  CpuAllocator a(kMiB);
  int x = 0;
  EXPECT_THROW(a.deallocate(&x, sizeof x), Error);
}

TEST(CpuAllocator, CacheLimitParsesMegabytes) {
  EXPECT_EQ(CpuAllocator::parse_cache_limit("0"), 0u);
  EXPECT_EQ(CpuAllocator::parse_cache_limit("512"), 512 * kMiB);
  EXPECT_GT(CpuAllocator::parse_cache_limit(nullptr), 0u);
  EXPECT_LE(CpuAllocator::parse_cache_limit(""), size_t{2} << 30);
  for (const char* bad : {"abc", "12MB", "-5", " "}) {
    try {
      CpuAllocator::parse_cache_limit(bad);
      FAIL() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("KILN_CPU_CACHE_LIMIT_MB"), std::string::npos) << e.what();
    }
  }
}

TEST(CpuAllocator, ManyThreadsAllocateAndFreeConcurrently) {
  CpuAllocator a(32 * kMiB);
  constexpr int kThreads = 8, kRounds = 300;
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::pair<unsigned char*, size_t>> held;
      for (int i = 0; i < kRounds; ++i) {
        // Sizes cycle through small classes and large blocks; each thread stamps its blocks with its id and
        // checks them before freeing, so a block handed to two owners at once shows up.
        const size_t sizes[] = {64, 1000, 70000, kMiB + 1, 3 * kMiB};
        const size_t bytes = sizes[(i + t) % 5];
        auto* p = static_cast<unsigned char*>(a.allocate(bytes));
        std::memset(p, t + 1, bytes);
        held.emplace_back(p, bytes);
        if (held.size() > 3 || i % 3 == 0) {
          auto [q, n] = held.front();
          held.erase(held.begin());
          if (q[0] != t + 1 || q[n / 2] != t + 1 || q[n - 1] != t + 1) corrupted.fetch_add(1);
          a.deallocate(q, n);
        }
      }
      for (auto [q, n] : held) a.deallocate(q, n);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(corrupted.load(), 0);
  const MemoryStats s = a.stats();
  EXPECT_EQ(s.current_bytes, 0);
  EXPECT_EQ(s.allocations, kThreads * kRounds);
  EXPECT_EQ(s.reserved_bytes, a.cached_bytes());
  EXPECT_LE(a.cached_bytes(), static_cast<int64_t>(32 * kMiB));
}

TEST(CpuAllocator, DeviceAllocatorReusesTensorMemoryAndEmptyCacheReleasesIt) {
  auto* device = dynamic_cast<CpuAllocator*>(&device_runtime(cpu).allocator());
  ASSERT_NE(device, nullptr);
  if (device->cache_limit() < 4 * kMiB) GTEST_SKIP() << "KILN_CPU_CACHE_LIMIT_MB disables the cache";
  const int64_t n = 3 * 1024 * 1024 / 4 + 5;  // a little over 3 MiB of float32: a 4 MiB block
  synchronize();
  void* first = nullptr;
  {
    Tensor t = Tensor::zeros({n}, float32);
    first = t.raw_data();
  }
  synchronize();
  const MemoryStats held = memory_stats();
  EXPECT_GE(held.reserved_bytes, held.current_bytes + static_cast<int64_t>(4 * kMiB));
  {
    Tensor t = Tensor::full({n}, 2.0, float32);
    EXPECT_EQ(t.raw_data(), first);
    EXPECT_EQ(t.to_vector<float>().back(), 2.0f);
  }
  synchronize();
  empty_cache();
  EXPECT_EQ(device->cached_bytes(), 0);
  EXPECT_LE(memory_stats().reserved_bytes, held.reserved_bytes - static_cast<int64_t>(4 * kMiB));
}

}  // namespace
}  // namespace kiln
