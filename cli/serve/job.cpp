#include "cli/serve/job.h"

#include <nlohmann/json.hpp>

namespace kiln::serve {

namespace {

using nlohmann::json;

double seconds_between(Job::Clock::time_point from, Job::Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

json error_json(const JobError& e) {
  return {{"message", e.message}, {"type", e.type}, {"param", e.param.empty() ? json() : json(e.param)}};
}

// Messages may quote bytes from outside (a path, a prompt cut anywhere): invalid UTF-8 becomes U+FFFD.
std::string text_of(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

const char* status_name(JobStatus status) {
  switch (status) {
    case JobStatus::Queued:
      return "queued";
    case JobStatus::Running:
      return "running";
    case JobStatus::Succeeded:
      return "succeeded";
    case JobStatus::Failed:
      return "failed";
    case JobStatus::Cancelled:
      return "cancelled";
  }
  return "unknown";
}

Job::Job(std::string id, std::string model, GenerationParams params, uint64_t seed)
    : id_(std::move(id)),
      model_(std::move(model)),
      params_(std::move(params)),
      seed_(seed),
      created_(Clock::now()) {}

std::string Job::image_path(size_t i) const {
  return "/v1/jobs/" + id_ + "/images/" + std::to_string(i) + ".png";
}

void Job::publish(std::string name, std::string data) {
  events_.push_back({std::move(name), std::move(data)});
  changed_.notify_all();
}

void Job::finish(JobStatus status) {
  status_ = status;
  ended_ = Clock::now();
  if (started_ == Clock::time_point{}) started_ = ended_;
}

void Job::queued_at(size_t position) {
  std::lock_guard lock(mutex_);
  if (status_ != JobStatus::Queued || position_ == position) return;
  position_ = position;
  publish("queued", text_of({{"position", position}}));
}

void Job::started() {
  std::lock_guard lock(mutex_);
  if (status_ != JobStatus::Queued) return;
  status_ = JobStatus::Running;
  started_ = Clock::now();
  publish("running", text_of({{"queue_seconds", seconds_between(created_, started_)}}));
}

void Job::stepped(int step, int steps, double seconds) {
  std::lock_guard lock(mutex_);
  step_ = step;
  steps_ = steps;
  publish("step", text_of({{"step", step}, {"steps", steps}, {"seconds", seconds}}));
}

void Job::succeeded(std::vector<std::string> pngs) {
  std::lock_guard lock(mutex_);
  json urls = json::array();
  for (std::string& png : pngs) {
    urls.push_back(image_path(pngs_.size()));
    pngs_.push_back(std::make_shared<const std::string>(std::move(png)));
  }
  finish(JobStatus::Succeeded);
  publish("done",
          text_of({{"images", urls}, {"seed", seed_}, {"seconds", seconds_between(started_, ended_)}}));
}

void Job::failed(JobError error) {
  std::lock_guard lock(mutex_);
  finish(JobStatus::Failed);
  publish("failed", text_of({{"error", error_json(error)}}));
  error_ = std::move(error);
}

void Job::cancel(const JobError& reason) {
  std::lock_guard lock(mutex_);
  if (!cancel_reason_) cancel_reason_ = reason;
  cancel_.cancel();
}

void Job::cancelled() {
  std::lock_guard lock(mutex_);
  finish(JobStatus::Cancelled);
  error_ = cancel_reason_.value_or(JobError{499, "cancelled", "", "the job was cancelled"});
  publish("cancelled", text_of({{"error", error_json(*error_)}}));
}

Job::Snapshot Job::snapshot() const {
  std::lock_guard lock(mutex_);
  Snapshot s;
  s.status = status_;
  s.position = position_.value_or(0);
  s.step = step_;
  s.steps = steps_;
  s.error = error_;
  s.images = pngs_.size();
  const Clock::time_point now = Clock::now();
  const bool started = status_ != JobStatus::Queued;
  const bool ended = status_ != JobStatus::Queued && status_ != JobStatus::Running;
  s.queue_seconds = seconds_between(created_, started ? started_ : now);
  s.run_seconds = started ? seconds_between(started_, ended ? ended_ : now) : 0;
  return s;
}

bool Job::finished() const {
  std::lock_guard lock(mutex_);
  return status_ != JobStatus::Queued && status_ != JobStatus::Running;
}

std::shared_ptr<const std::string> Job::png(size_t i) const {
  std::lock_guard lock(mutex_);
  return i < pngs_.size() ? pngs_[i] : nullptr;
}

std::vector<JobEvent> Job::events_after(size_t seen, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return events_.size() > seen; });
  if (events_.size() <= seen) return {};
  return {events_.begin() + static_cast<std::ptrdiff_t>(seen), events_.end()};
}

bool Job::wait_finished(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout,
                           [&] { return status_ != JobStatus::Queued && status_ != JobStatus::Running; });
}

}  // namespace kiln::serve
