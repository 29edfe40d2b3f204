// One generation job of `kiln serve`: what was asked (the parsed parameters, the model, the seed), where it
// stands, the PNGs it made, and the events its clients follow (GET /v1/jobs/{id}/events). Thread-safe: the
// worker that runs it, the HTTP handlers that wait on it and whoever cancels it share it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cli/serve/generation_params.h"
#include "kiln/pipelines/pipeline_request.h"

namespace kiln::serve {

enum class JobStatus { Queued, Running, Succeeded, Failed, Cancelled };
const char* status_name(JobStatus status);  // "queued", "running", "succeeded", "failed", "cancelled"

// Why a job did not succeed, as the server answers it: 400 for a request the pipeline refused (`param` names
// the JSON field), 500 for a failure inside the job, 503 for a job cancelled by the shutdown, 499 for a job
// its client cancelled.
struct JobError {
  int http_status = 500;
  std::string type;  // OpenAI's error types: invalid_request_error, server_error, cancelled
  std::string param;
  std::string message;
};

// A server-sent event: its name (queued, running, step, done, failed, cancelled) and its data, a JSON object.
struct JobEvent {
  std::string name;
  std::string data;
};

class Job {
 public:
  using Clock = std::chrono::steady_clock;

  Job(std::string id, std::string model, GenerationParams params, uint64_t seed);

  const std::string& id() const { return id_; }
  const std::string& model() const { return model_; }  // the model's id (ModelPool)
  const GenerationParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }
  // The pipeline call's token: set by cancel(), it stops the call at its next step.
  const CancellationToken& cancel_token() const { return cancel_; }
  // Asks the job to stop; `reason` is what its clients are told once it has (the first reason given wins).
  void cancel(const JobError& reason);
  // Where its image number `i` is served: /v1/jobs/{id}/images/{i}.png
  std::string image_path(size_t i) const;

  // The transitions, each published as an event. queued_at publishes only a change of position (0: next).
  void queued_at(size_t position);
  void started();
  void stepped(int step, int steps, double seconds);  // step from 1
  void succeeded(std::vector<std::string> pngs);
  void failed(JobError error);
  // Ends a job that stopped because it was cancelled, with the reason cancel() was given.
  void cancelled();

  struct Snapshot {
    JobStatus status = JobStatus::Queued;
    size_t position = 0;  // while queued
    int step = 0, steps = 0;
    std::optional<JobError> error;
    size_t images = 0;
    double queue_seconds = 0;  // from submission to start (or to now)
    double run_seconds = 0;    // from start to end (or to now)
  };
  Snapshot snapshot() const;
  bool finished() const;
  // PNG number `i` (with its parameters in text chunks) once the job succeeded; null otherwise.
  std::shared_ptr<const std::string> png(size_t i) const;

  // Waits at most `timeout` for events after the first `seen`, and returns those (none on a timeout).
  std::vector<JobEvent> events_after(size_t seen, std::chrono::milliseconds timeout) const;
  // Waits at most `timeout` for the job to end; returns whether it has.
  bool wait_finished(std::chrono::milliseconds timeout) const;

 private:
  void publish(std::string name, std::string data);  // mutex_ held
  void finish(JobStatus status);                     // mutex_ held

  const std::string id_;
  const std::string model_;
  const GenerationParams params_;
  const uint64_t seed_;
  const CancellationToken cancel_;
  const Clock::time_point created_;

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  JobStatus status_ = JobStatus::Queued;
  std::optional<size_t> position_;
  int step_ = 0, steps_ = 0;
  std::optional<JobError> error_;
  std::optional<JobError> cancel_reason_;
  std::vector<std::shared_ptr<const std::string>> pngs_;
  std::vector<JobEvent> events_;
  Clock::time_point started_, ended_;
};

}  // namespace kiln::serve
