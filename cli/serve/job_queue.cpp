#include "cli/serve/job_queue.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kiln::serve {

JobQueue::JobQueue(QueueOptions options, size_t lanes, LaneOf lane_of, Runner run, OnEnd on_end)
    : options_(options),
      lane_of_(std::move(lane_of)),
      run_(std::move(run)),
      on_end_(std::move(on_end)),
      lanes_(lanes),
      ids_(std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32)) {
  KILN_CHECK(lanes > 0, "JobQueue: expected at least one lane");
  for (size_t lane = 0; lane < lanes; ++lane) workers_.emplace_back([this, lane] { work(lane); });
}

JobQueue::~JobQueue() {
  shutdown({503, "server_error", "", "the server is shutting down"});
}

std::string JobQueue::new_id() {
  // Random, so that one client cannot guess another's job.
  for (;;) {
    char id[24];
    std::snprintf(id, sizeof id, "job_%016llx", static_cast<unsigned long long>(ids_()));
    if (jobs_.count(id) == 0) return id;
  }
}

std::shared_ptr<Job> JobQueue::submit(const std::string& model, GenerationParams params, uint64_t seed) {
  const size_t lane = lane_of_(model);
  KILN_CHECK(lane < lanes_, "JobQueue: lane " << lane << " of model " << model << " is not below " << lanes_);
  std::lock_guard lock(mutex_);
  if (stopping_) throw ShuttingDown("the server is shutting down and takes no new jobs");
  if (waiting_.size() >= options_.capacity) {
    throw QueueFull("the queue is full: " + std::to_string(waiting_.size()) + " jobs are waiting (--queue " +
                        std::to_string(options_.capacity) + "); try again later",
                    retry_after_locked());
  }
  auto job = std::make_shared<Job>(new_id(), model, std::move(params), seed);
  jobs_[job->id()] = job;
  waiting_.push_back({job, lane});
  update_positions();
  work_available_.notify_all();
  return job;
}

std::shared_ptr<Job> JobQueue::find(const std::string& id) const {
  std::lock_guard lock(mutex_);
  const auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

bool JobQueue::cancel(const std::string& id, const JobError& reason) {
  std::shared_ptr<Job> job;
  {
    std::lock_guard lock(mutex_);
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if (it->job->id() != id) continue;
      job = it->job;
      waiting_.erase(it);
      update_positions();
      break;
    }
    if (!job) {
      const auto it = running_.find(id);
      // A job that has ended is not cancelled again, even in the moment before its worker takes it off the
      // running list.
      if (it == running_.end() || it->second->finished()) return false;
      // The worker ends it (Cancelled at the next step) and keeps it.
      it->second->cancel(reason);
      return true;
    }
  }
  job->cancel(reason);
  job->cancelled();
  ended(job);
  return true;
}

void JobQueue::shutdown(const JobError& reason) {
  std::vector<std::shared_ptr<Job>> cancelled;
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      stopping_ = true;
      for (Waiting& w : waiting_) cancelled.push_back(w.job);
      waiting_.clear();
      for (auto& [id, job] : running_) job->cancel(reason);
      work_available_.notify_all();
    }
  }
  for (const auto& job : cancelled) {
    job->cancel(reason);
    job->cancelled();
    ended(job);
  }
  for (std::thread& worker : workers_)
    if (worker.joinable() && worker.get_id() != std::this_thread::get_id()) worker.join();
}

size_t JobQueue::waiting() const {
  std::lock_guard lock(mutex_);
  return waiting_.size();
}

size_t JobQueue::running() const {
  std::lock_guard lock(mutex_);
  return running_.size();
}

int JobQueue::retry_after_seconds() const {
  std::lock_guard lock(mutex_);
  return retry_after_locked();
}

int JobQueue::retry_after_locked() const {
  // Before any job has ended, a second per job.
  const double mean = jobs_done_ > 0 ? job_seconds_ / double(jobs_done_) : 1.0;
  const double wait = mean * double(waiting_.size() + running_.size()) / double(lanes_);
  return static_cast<int>(std::clamp(std::ceil(wait), 1.0, 3600.0));
}

void JobQueue::update_positions() {
  std::vector<size_t> ahead(lanes_, 0);
  for (Waiting& w : waiting_) w.job->queued_at(ahead[w.lane]++);
}

void JobQueue::ended(const std::shared_ptr<Job>& job) {
  if (on_end_) on_end_(*job);
  std::lock_guard lock(mutex_);
  finished_.push_back(job->id());
  // Clients still holding an evicted job (a handler writing its answer) keep it alive until they are done.
  while (finished_.size() > options_.keep_finished) {
    jobs_.erase(finished_.front());
    finished_.pop_front();
  }
}

void JobQueue::work(size_t lane) {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mutex_);
      const auto mine = [&] {
        return std::find_if(waiting_.begin(), waiting_.end(),
                            [&](const Waiting& w) { return w.lane == lane; });
      };
      work_available_.wait(lock, [&] { return stopping_ || mine() != waiting_.end(); });
      if (stopping_) return;  // shutdown() cancelled what was waiting
      const auto it = mine();
      job = it->job;
      waiting_.erase(it);
      running_[job->id()] = job;
      update_positions();
    }
    job->started();
    // A job that was cancelled between leaving the queue and starting is cancelled by the pipeline call at
    // once (its token is set).
    run_(*job);
    {
      std::lock_guard lock(mutex_);
      running_.erase(job->id());
      job_seconds_ += job->snapshot().run_seconds;
      ++jobs_done_;
    }
    ended(job);
  }
}

}  // namespace kiln::serve
