#include "runtime/weight_group_tracker.h"

#include <chrono>
#include <cstdio>

#include "kiln/core/bytes.h"
#include "kiln/core/device_runtime.h"
#include "kiln/core/log.h"

namespace kiln::runtime {

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    quit_ = true;
    queued_.clear();
    cancel_.store(true);
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Prefetcher::request(std::vector<std::shared_ptr<Storage>> storages, std::string what) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  queued_ = std::move(storages);
  queued_what_ = std::move(what);
  has_work_ = true;
  wake_.notify_one();
}

void Prefetcher::cancel_and_wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  has_work_ = false;
  queued_.clear();
  cancel_.store(true);
  idle_.wait(lock, [this] { return !running_; });
  cancel_.store(false);
}

void Prefetcher::run() {
  for (;;) {
    std::vector<std::shared_ptr<Storage>> work;
    std::string what;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return has_work_ || quit_; });
      if (quit_) return;
      work.swap(queued_);
      what.swap(queued_what_);
      has_work_ = false;
      running_ = true;
    }
    const auto start = std::chrono::steady_clock::now();
    size_t bytes = 0;
    for (const auto& storage : work) {
      if (cancel_.load()) break;
      bytes += device_runtime(storage->device()).weight_tier().bring_in(*storage, cancel_);
    }
    bytes_done_ += static_cast<int64_t>(bytes);
    if (log_enabled("offload")) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      char line[256];
      std::snprintf(line, sizeof line, "prefetched %s: %s in %.0f ms%s", what.c_str(),
                    format_bytes(static_cast<int64_t>(bytes)).c_str(), ms,
                    cancel_.load() ? " (cancelled)" : "");
      log("offload", line);
    }
    work.clear();  // the storages may be freed now
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
    }
    idle_.notify_all();
  }
}

void WeightGroupTracker::set(std::vector<WeightGroup> groups, bool prefetch) {
  prefetcher_.cancel_and_wait();
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.clear();
  group_of_.clear();
  for (auto& g : groups) {
    Group group{g.component, g.name, {}, -1};
    for (const Tensor& w : g.weights) {
      if (!w.defined() || !w.storage()->can_send_out()) continue;  // converted copies cannot be sent out
      const Storage* key = w.storage().get();
      if (group_of_.count(key)) continue;  // views of one storage belong to its first group
      group_of_[key] = {static_cast<int>(groups_.size()), w.storage()};
      group.storages.push_back(w.storage());
    }
    groups_.push_back(std::move(group));
  }
  prefetch_ = prefetch;
  current_ = prefetched_ = -1;
  stats_ = {};
  prefetched_bytes_at_start_ = prefetcher_.bytes_done();
  stats_.groups = static_cast<int64_t>(groups_.size());
  active_.store(!groups_.empty());
  generation_.fetch_add(1, std::memory_order_relaxed);
}

int WeightGroupTracker::group_of(const Storage& storage) {
  if (!active()) return -1;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = group_of_.find(&storage);
  if (it == group_of_.end() || it->second.storage.expired()) return -1;
  return it->second.group;
}

void WeightGroupTracker::stop() {
  prefetcher_.cancel_and_wait();
  std::lock_guard<std::mutex> lock(mutex_);
  current_ = prefetched_ = -1;
}

WeightGroupStats WeightGroupTracker::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  WeightGroupStats s = stats_;
  s.prefetched_bytes = prefetcher_.bytes_done() - prefetched_bytes_at_start_;
  return s;
}

void WeightGroupTracker::note_read(const Storage& storage) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = group_of_.find(&storage);
  if (it == group_of_.end() || it->second.storage.expired()) return;
  const int g = it->second.group;
  if (g == current_) return;
  ++stats_.switches;
  const int before = current_;
  if (before >= 0) groups_[before].next = g;  // what followed, for the next prediction
  const bool hit = prefetched_ == g;
  stats_.prefetch_hits += hit;
  // A group brought in for nothing (the prediction was wrong) goes out with the one that ran.
  if (prefetched_ >= 0 && !hit) {
    prefetcher_.cancel_and_wait();
    send_out(prefetched_);
  }
  if (before >= 0 && before != g) send_out(before);
  current_ = g;
  prefetched_ = -1;
  if (log_enabled("offload")) {
    std::string line =
        groups_[g].component + " " + groups_[g].name + " runs" + (hit ? " (prefetched)" : "") +
        (before >= 0 ? "; " + groups_[before].component + " " + groups_[before].name + " out" : "");
    log("offload", line);
  }
  if (!prefetch_) return;
  const int next = expected_after(g);
  if (next < 0 || next == g) return;
  prefetched_ = next;
  ++stats_.prefetches;
  std::vector<std::shared_ptr<Storage>> storages;
  for (const auto& weak : groups_[next].storages)
    if (auto s = weak.lock()) storages.push_back(std::move(s));
  prefetcher_.request(std::move(storages), groups_[next].component + " " + groups_[next].name);
}

int WeightGroupTracker::expected_after(int g) const {
  if (groups_[g].next >= 0) return groups_[g].next;
  const std::string& component = groups_[g].component;
  if (g + 1 < static_cast<int>(groups_.size()) && groups_[g + 1].component == component) return g + 1;
  int first = g;  // wraps to the component's first group: a denoising loop runs its blocks again
  while (first > 0 && groups_[first - 1].component == component) --first;
  return first;
}

void WeightGroupTracker::send_out(int g) {
  for (const auto& weak : groups_[g].storages)
    if (auto s = weak.lock()) device_runtime(s->device()).weight_tier().send_out(*s);
  ++stats_.released;
}

}  // namespace kiln::runtime
