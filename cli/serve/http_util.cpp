#include "cli/serve/http_util.h"

namespace kiln::serve {

using nlohmann::json;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  // Messages can quote bytes from outside that are not UTF-8 (a path, a prompt cut short): replaced, never
  // a throw while answering.
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", "application/json");
}

void send_error(httplib::Response& res, const ApiError& error) {
  json body = {{"message", error.what()},
               {"type", error.type},
               {"param", error.param.empty() ? json() : json(error.param)},
               {"code", error.code.empty() ? json() : json(error.code)}};
  if (error.retry_after > 0) res.set_header("Retry-After", std::to_string(error.retry_after));
  send_json(res, error.status, {{"error", body}});
}

ApiError job_error(const JobError& error) {
  return ApiError(error.http_status, error.type, error.param, error.message,
                  error.http_status == 499 ? "cancelled" : "");
}

void guarded(httplib::Response& res, const std::function<void()>& handler) {
  try {
    handler();
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const std::exception& e) {
    send_error(res, ApiError(500, "server_error", "", e.what()));
  } catch (...) {
    send_error(res, ApiError(500, "server_error", "", "an unknown error"));
  }
}

std::shared_ptr<Job> job_of(const httplib::Request& req, const JobQueue& queue) {
  const std::string id = req.matches.size() > 1 ? req.matches[1].str() : "";
  std::shared_ptr<Job> job = queue.find(id);
  if (!job)
    throw ApiError(404, "not_found_error", "id",
                   "no job '" + id + "' (finished jobs are kept for a while: --keep-jobs)", "job_not_found");
  return job;
}

json job_json(const Job& job) {
  const Job::Snapshot s = job.snapshot();
  const GenerationParams& p = job.params();
  // The parameters as the client could send them again (the page's "reuse"), with the seed that was used.
  json params = json::parse(to_json_text(p, false));
  params["model"] = job.model();
  params["seed"] = job.seed();
  params.erase("response_format");
  json out = {{"id", job.id()},
              {"object", "kiln.job"},
              {"status", status_name(s.status)},
              {"params", params},
              {"events", "/v1/jobs/" + job.id() + "/events"},
              {"queue_seconds", s.queue_seconds},
              {"run_seconds", s.run_seconds}};
  if (s.status == JobStatus::Queued) out["position"] = s.position;
  if (s.steps > 0) out["progress"] = {{"step", s.step}, {"steps", s.steps}};
  json images = json::array();
  for (size_t i = 0; i < s.images; ++i) images.push_back(job.image_path(i));
  out["images"] = images;
  if (s.error)
    out["error"] = {{"message", s.error->message},
                    {"type", s.error->type},
                    {"param", s.error->param.empty() ? json() : json(s.error->param)}};
  return out;
}

}  // namespace kiln::serve
