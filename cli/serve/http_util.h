// The small pieces every route of `kiln serve` uses: JSON answers, OpenAI-shaped errors, and the guard that
// turns whatever a handler throws into an answer (a bad request never crashes the server).
#pragma once

#include <httplib.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/serve/api_error.h"
#include "cli/serve/job.h"
#include "cli/serve/job_queue.h"

namespace kiln::serve {

void send_json(httplib::Response& res, int status, const nlohmann::json& body);
void send_error(httplib::Response& res, const ApiError& error);
// The error a job that did not succeed is answered with.
ApiError job_error(const JobError& error);

// Runs `handler`; an ApiError becomes its answer, any other exception a 500 naming what went wrong.
void guarded(httplib::Response& res, const std::function<void()>& handler);

// The job named by the route's first capture, or a 404.
std::shared_ptr<Job> job_of(const httplib::Request& req, const JobQueue& queue);

// A job as GET /v1/jobs/{id} shows it: its status, progress, parameters, images and error.
nlohmann::json job_json(const Job& job);

}  // namespace kiln::serve
