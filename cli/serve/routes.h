// The HTTP routes of `kiln serve`, by API. Each adds its handlers to the server; they share ServerState.
#pragma once

#include <httplib.h>

#include <string>

#include "cli/serve/server_state.h"

namespace kiln::serve {

// OpenAI's images API: POST /v1/images/generations (the answer waits for the images) and GET /v1/models.
void add_openai_routes(httplib::Server& server, ServerState& state);
// Kiln's jobs: POST /v1/generate, GET /v1/jobs/{id}, GET /v1/jobs/{id}/events (server-sent events),
// GET /v1/jobs/{id}/images/{i}.png, DELETE /v1/jobs/{id}.
void add_job_routes(httplib::Server& server, ServerState& state);
// GET /health and GET /metrics.
void add_status_routes(httplib::Server& server, ServerState& state);
// The web page: GET / and its script and style sheet, served from memory.
void add_page_routes(httplib::Server& server);
// Whether `path` is the page or one of its files (which need no API key: they hold no secret).
bool is_page_path(const std::string& path);

}  // namespace kiln::serve
