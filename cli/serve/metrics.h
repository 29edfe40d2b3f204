// What `kiln serve` counts, rendered for GET /metrics in Prometheus' text format (version 0.0.4): jobs by
// outcome, images, denoising step and queue-wait times as histograms, HTTP answers by status, and memory (the
// process's, and on a device what Kiln holds there and what its plugin reports).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cli/serve/job.h"
#include "kiln/core/device.h"

namespace kiln::serve {

// A Prometheus histogram with fixed bucket bounds (seconds).
class Histogram {
 public:
  static constexpr std::array<double, 11> kBounds = {0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300};
  void observe(double value);
  // The _bucket, _sum and _count lines of `name`.
  std::string render(const std::string& name) const;

 private:
  std::array<uint64_t, kBounds.size()> buckets_{};  // observations <= each bound (not cumulative)
  uint64_t count_ = 0;
  double sum_ = 0;
};

class Metrics {
 public:
  // What the queue and the pool hold at the moment of a scrape.
  struct Gauges {
    size_t queue_length = 0;
    size_t running = 0;
    size_t models = 0;
    size_t models_loaded = 0;
    std::vector<Device> devices;  // whose memory to report besides the cpu's
  };

  void job_submitted();
  void job_refused_queue_full();
  void job_ended(const Job::Snapshot& end);
  void step(double seconds);
  void http_answer(int status);

  std::string render(const Gauges& gauges) const;

 private:
  mutable std::mutex mutex_;
  uint64_t submitted_ = 0;
  uint64_t refused_queue_full_ = 0;
  std::map<std::string, uint64_t> ended_;  // by status name
  uint64_t images_ = 0;
  Histogram step_seconds_, queue_seconds_, job_seconds_;
  std::map<int, uint64_t> http_answers_;
};

// This process's resident memory in bytes (/proc/self/statm), 0 where it cannot be read.
int64_t resident_memory_bytes();

}  // namespace kiln::serve
