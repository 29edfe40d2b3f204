// Kiln's job API: a job is queued at once and followed by its id, as the web page does:
//   POST /v1/generate                 202 {"id": "job_...", "status": "queued", ...}
//   GET  /v1/jobs/{id}                its status, progress, parameters, images and error
//   GET  /v1/jobs/{id}/events         server-sent events: queued {position}, running, step {step, steps},
//                                     done {images}, failed {error}, cancelled {error}; the stream ends
//                                     after the last one. Each has an id, so a client that reconnects with
//                                     Last-Event-ID gets only what it missed.
//   GET  /v1/jobs/{id}/images/{i}.png the PNG, with the parameters in its text chunks
//   DELETE /v1/jobs/{id}              cancels it (a running job stops at its next step)
#include <chrono>

#include "cli/serve/http_util.h"
#include "cli/serve/routes.h"
#include "cli/serve/submit.h"

namespace kiln::serve {

namespace {

using nlohmann::json;

constexpr const char* kJobId = "(job_[0-9a-f]+)";
// How long an event stream waits for news before it looks again, and how often it writes a comment when
// there is none (which is also how it notices a client that left).
constexpr std::chrono::milliseconds kEventWait{500};
constexpr std::chrono::seconds kKeepAlive{10};

// The number of events a reconnecting client has already seen (its Last-Event-ID), else 0.
size_t events_seen(const httplib::Request& req) {
  const std::string last = req.get_header_value("Last-Event-ID");
  if (last.empty() || last.size() > 9 || last.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stoul(last);
}

void stream_events(const httplib::Request& req, httplib::Response& res, const std::shared_ptr<Job>& job) {
  struct Stream {
    size_t seen;
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  };
  auto stream = std::make_shared<Stream>(Stream{events_seen(req)});
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // proxies must not hold events back
  // Called again and again until it calls done() or returns false (the client left).
  res.set_chunked_content_provider("text/event-stream", [job, stream](size_t, httplib::DataSink& sink) {
    // Once finished, every event has been published (the job publishes its last one as it ends).
    const bool finished = job->finished();
    const std::vector<JobEvent> events =
        job->events_after(stream->seen, finished ? std::chrono::milliseconds(0) : kEventWait);
    std::string text;
    for (const JobEvent& e : events)
      text += "id: " + std::to_string(++stream->seen) + "\nevent: " + e.name + "\ndata: " + e.data + "\n\n";
    const auto now = std::chrono::steady_clock::now();
    if (text.empty() && now - stream->last_write > kKeepAlive) text = ": keep-alive\n\n";
    if (!text.empty()) {
      if (!sink.write(text.data(), text.size())) return false;
      stream->last_write = now;
    }
    if (finished) sink.done();
    return true;
  });
}

void send_image(const httplib::Request& req, httplib::Response& res, const JobQueue& queue) {
  const std::shared_ptr<Job> job = job_of(req, queue);
  const std::string index = req.matches[2].str();
  const std::shared_ptr<const std::string> png = index.size() <= 4 ? job->png(std::stoul(index)) : nullptr;
  if (!png)
    throw ApiError(404, "not_found_error", "",
                   "job " + job->id() + " has no image " + index + " (it is " +
                       status_name(job->snapshot().status) + ")");
  res.set_header("Content-Disposition", "inline; filename=\"" + job->id() + "-" + index + ".png\"");
  res.set_header("Cache-Control", "private, max-age=3600");  // an image never changes
  res.set_content(*png, "image/png");
}

void cancel_job(const httplib::Request& req, httplib::Response& res, ServerState& state) {
  const std::shared_ptr<Job> job = job_of(req, state.queue);
  const JobStatus status = job->snapshot().status;
  if (status == JobStatus::Succeeded || status == JobStatus::Failed)
    throw ApiError(409, "invalid_request_error", "id",
                   "job " + job->id() + " has already ended (" + status_name(status) + ")", "job_ended");
  state.queue.cancel(job->id(), {499, "cancelled", "", "cancelled by DELETE /v1/jobs/" + job->id()});
  send_json(res, 200, job_json(*job));
}

}  // namespace

void add_job_routes(httplib::Server& server, ServerState& state) {
  server.Post("/v1/generate", [&state](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const std::shared_ptr<Job> job = submit_job(req.body, state);
      res.set_header("Location", "/v1/jobs/" + job->id());
      send_json(res, 202, job_json(*job));
    });
  });
  server.Get(std::string("/v1/jobs/") + kJobId,
             [&state](const httplib::Request& req, httplib::Response& res) {
               guarded(res, [&] { send_json(res, 200, job_json(*job_of(req, state.queue))); });
             });
  server.Get(std::string("/v1/jobs/") + kJobId + "/events",
             [&state](const httplib::Request& req, httplib::Response& res) {
               guarded(res, [&] { stream_events(req, res, job_of(req, state.queue)); });
             });
  server.Get(std::string("/v1/jobs/") + kJobId + "/images/([0-9]+)\\.png",
             [&state](const httplib::Request& req, httplib::Response& res) {
               guarded(res, [&] { send_image(req, res, state.queue); });
             });
  server.Delete(std::string("/v1/jobs/") + kJobId,
                [&state](const httplib::Request& req, httplib::Response& res) {
                  guarded(res, [&] { cancel_job(req, res, state); });
                });
}

}  // namespace kiln::serve
