// Group offload's state for one execution context (kiln/runtime/weight_groups.h says what it does): the
// registered groups, which one is current, and the background thread that brings the expected next group in.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kiln/runtime/weight_groups.h"

namespace kiln::runtime {

// One background thread that maps a group's pages while the kernels compute the current group. Started with
// its first request; stopped and joined when destroyed.
class Prefetcher {
 public:
  ~Prefetcher();
  // Replaces any queued work; a prefetch in flight finishes first (or is cancelled by cancel_and_wait).
  void request(std::vector<std::shared_ptr<Storage>> storages, std::string what);
  // Drops queued work, stops the prefetch in flight at its next slice, and waits until it has.
  void cancel_and_wait();
  int64_t bytes_done() const { return bytes_done_.load(); }

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::vector<std::shared_ptr<Storage>> queued_;
  std::string queued_what_;
  bool has_work_ = false;
  bool running_ = false;
  bool quit_ = false;
  std::atomic<bool> cancel_{false};
  std::atomic<int64_t> bytes_done_{0};
  std::thread thread_;
};

class WeightGroupTracker {
 public:
  bool active() const { return active_.load(std::memory_order_relaxed); }
  void set(std::vector<WeightGroup> groups, bool prefetch);
  void stop();
  WeightGroupStats stats();
  // A kernel is about to read `storage`: a weight of another group makes that group the current one.
  void note_read(const Storage& storage);
  // The registered group `storage` belongs to, -1 when none.
  int group_of(const Storage& storage);
  // Changes with every set(): a program planned under one registration tells it from the next.
  uint64_t generation() const { return generation_.load(std::memory_order_relaxed); }

 private:
  struct Group {
    std::string component, name;
    std::vector<std::weak_ptr<Storage>> storages;
    int next;  // the group that followed this one last time; -1 before it has run
  };
  struct Membership {
    int group;
    std::weak_ptr<Storage> storage;  // tells a live weight from a freed one whose address was reused
  };

  int expected_after(int g) const;
  void send_out(int g);

  Prefetcher prefetcher_;  // never takes mutex_, so waiting for it under mutex_ cannot deadlock
  std::atomic<bool> active_{false};
  std::atomic<uint64_t> generation_{0};
  std::mutex mutex_;
  std::vector<Group> groups_;
  std::unordered_map<const Storage*, Membership> group_of_;
  bool prefetch_ = true;
  int current_ = -1, prefetched_ = -1;
  WeightGroupStats stats_;
  int64_t prefetched_bytes_at_start_ = 0;
};

}  // namespace kiln::runtime
