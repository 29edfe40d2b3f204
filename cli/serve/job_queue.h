// The jobs of `kiln serve`: a bounded queue of waiting jobs, one worker thread per lane, and the finished
// jobs kept for their clients. A lane is a set of jobs that run one after another: one per model when every
// model stays loaded (pipelines of different models run side by side), a single one when models are loaded
// in turn. A job waits behind the jobs of its lane that came before it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli/serve/job.h"
#include "kiln/core/error.h"

namespace kiln::serve {

struct QueueOptions {
  size_t capacity = 16;       // jobs waiting to start (running ones not counted): --queue
  size_t keep_finished = 64;  // finished jobs kept for GET /v1/jobs/{id} and their images: --keep-jobs
};

// submit() when `capacity` jobs already wait: the server answers 503 with Retry-After.
class QueueFull : public Error {
 public:
  QueueFull(const std::string& message, int retry_after) : Error(message), retry_after_(retry_after) {}
  int retry_after() const { return retry_after_; }

 private:
  int retry_after_;
};

// submit() once shutdown() has begun.
class ShuttingDown : public Error {
 public:
  using Error::Error;
};

class JobQueue {
 public:
  // Runs a started job to its end: it must leave the job succeeded, failed or cancelled.
  using Runner = std::function<void(Job&)>;
  // The lane (0 to lanes - 1) of a job's model.
  using LaneOf = std::function<size_t(const std::string& model)>;
  // Called once for every job that ends, however it ended (run, or cancelled while it waited).
  using OnEnd = std::function<void(const Job&)>;

  JobQueue(QueueOptions options, size_t lanes, LaneOf lane_of, Runner run, OnEnd on_end);
  ~JobQueue();  // shutdown()
  JobQueue(const JobQueue&) = delete;
  JobQueue& operator=(const JobQueue&) = delete;

  // Queues a new job with a fresh id; throws QueueFull or ShuttingDown.
  std::shared_ptr<Job> submit(const std::string& model, GenerationParams params, uint64_t seed);
  // A queued, running or kept finished job; null when there is none by that id.
  std::shared_ptr<Job> find(const std::string& id) const;
  // A waiting job leaves the queue at once; a running one stops at its next step. `reason` is what its
  // clients are told. False when there is no such job or it had already ended.
  bool cancel(const std::string& id, const JobError& reason);
  // Refuses new jobs, cancels the waiting ones and asks the running ones to stop at their next step, then
  // waits for the workers. Idempotent.
  void shutdown(const JobError& reason);

  size_t waiting() const;
  size_t running() const;
  // Seconds a client refused with QueueFull should wait: the queue's length times the mean job time so far.
  int retry_after_seconds() const;

 private:
  void work(size_t lane);
  void update_positions();         // mutex_ held
  int retry_after_locked() const;  // mutex_ held
  // Records the end of a job (on_end_) and keeps it among the finished ones.
  void ended(const std::shared_ptr<Job>& job);
  std::string new_id();  // mutex_ held

  const QueueOptions options_;
  const LaneOf lane_of_;
  const Runner run_;
  const OnEnd on_end_;

  mutable std::mutex mutex_;
  std::condition_variable work_available_;
  bool stopping_ = false;
  struct Waiting {
    std::shared_ptr<Job> job;
    size_t lane;
  };
  std::list<Waiting> waiting_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;  // waiting, running and kept
  std::map<std::string, std::shared_ptr<Job>> running_;
  std::deque<std::string> finished_;  // oldest first
  double job_seconds_ = 0;            // all finished jobs' run time, for retry_after_seconds
  size_t jobs_done_ = 0;
  size_t lanes_;
  std::mt19937_64 ids_;
  std::vector<std::thread> workers_;
};

}  // namespace kiln::serve
