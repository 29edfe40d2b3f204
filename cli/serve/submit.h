// A request body becomes a queued job: parsed (generation_params.h), its model found, the request checked
// against that model's pipeline before it waits in the queue (its class's fields at once; sizes and limits
// too when the pipeline is loaded), a seed chosen when none is given. POST /v1/images/generations and
// POST /v1/generate both go through here.
#pragma once

#include <memory>
#include <string_view>

#include "cli/serve/job.h"
#include "cli/serve/server_state.h"

namespace kiln::serve {

// Throws ApiError: 400 naming the field for a bad request, 404 for a model this server does not have, 503
// (with Retry-After) when the queue is full, 503 when the server is shutting down.
std::shared_ptr<Job> submit_job(std::string_view body, ServerState& state);

}  // namespace kiln::serve
