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
// The same for parameters parsed already (an edit's form: cli/serve/edit_form.h).
std::shared_ptr<Job> submit_job(GenerationParams params, ServerState& state);

// The class a job runs on its model's folder (of class `folder`): the folder's own, unless the request
// carries an image the folder's class does not take; then its image-to-image class, or its inpainting class
// with a mask (class_for_images: as `kiln generate --init-image/--mask` picks), made from the loaded
// pipeline. RequestError naming "image" or "mask_image" when the folder has none.
const PipelineClass& class_for_job(const PipelineClass& folder, const PipelineRequest& request);

}  // namespace kiln::serve
