// The HTTP routes of `kiln serve`, by API. Each adds its handlers to the server; they share ServerState.
#pragma once

#include <httplib.h>

#include <memory>
#include <string>
#include <string_view>

#include "cli/serve/job.h"

#include "cli/serve/server_state.h"

namespace kiln::serve {

// OpenAI's images API: POST /v1/images/generations and /v1/images/edits (the answer waits for the images) and
// GET /v1/models.
void add_openai_routes(httplib::Server& server, ServerState& state);
// Kiln's jobs: POST /v1/generate, GET /v1/jobs/{id}, GET /v1/jobs/{id}/events (server-sent events),
// GET /v1/jobs/{id}/images/{i}.png, DELETE /v1/jobs/{id}.
void add_job_routes(httplib::Server& server, ServerState& state);
// AUTOMATIC1111's API as front-ends speak it: POST /sdapi/v1/txt2img and img2img (cli/serve/a1111_params.h).
void add_a1111_routes(httplib::Server& server, ServerState& state);
// Submits `body` (a generation request) and waits for its job to end; a client that closes its connection
// meanwhile cancels it. Throws ApiError for a request refused or a job that did not succeed.
std::shared_ptr<Job> run_job_for(const httplib::Request& req, std::string_view body, ServerState& state);
// The same for a job submitted already.
std::shared_ptr<Job> wait_for_job(const httplib::Request& req, std::shared_ptr<Job> job, ServerState& state);
// GET /health and GET /metrics.
void add_status_routes(httplib::Server& server, ServerState& state);
// The web page: GET / and its script and style sheet, served from memory.
void add_page_routes(httplib::Server& server);
// Whether `path` is the page or one of its files (which need no API key: they hold no secret).
bool is_page_path(const std::string& path);

}  // namespace kiln::serve
