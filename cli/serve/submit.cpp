#include "cli/serve/submit.h"

#include <random>

#include "cli/serve/api_error.h"

namespace kiln::serve {

namespace {

// As `kiln generate` picks a seed when none is given; the job reports it and its images store it.
uint64_t random_seed() {
  std::random_device device;
  return (uint64_t{device()} << 16) ^ device();
}

}  // namespace

const PipelineClass& class_for_job(const PipelineClass& folder, const PipelineRequest& request) {
  if (request.image.empty() || folder.takes("image")) return folder;
  return class_for_images(folder, request.mask_image.has_value());
}

std::shared_ptr<Job> submit_job(std::string_view body, ServerState& state) {
  GenerationParams params;
  try {
    params = parse_generation_params(body);
  } catch (const RequestError& e) {
    throw ApiError(400, "invalid_request_error", e.field(), e.what());
  }
  return submit_job(std::move(params), state);
}

std::shared_ptr<Job> submit_job(GenerationParams params, ServerState& state) {
  const ModelPool::Model* model = state.pool.find(params.model);
  if (model == nullptr) {
    std::string names;
    for (const auto& m : state.pool.models()) names += (names.empty() ? "" : ", ") + m.id;
    throw ApiError(
        404, "invalid_request_error", "model",
        "model: '" + params.model + "' is not served here (GET /v1/models lists them: " + names + ")",
        "model_not_found");
  }
  try {
    if (state.loras != nullptr) {
      state.loras->check(params.loras);
    } else if (!params.loras.empty()) {
      throw RequestError("loras",
                         "loras: this server offers no LoRA adapters (start kiln serve with --lora-dir DIR)");
    }
  } catch (const RequestError& e) {
    throw ApiError(400, "invalid_request_error", "loras", e.what());
  }
  const uint64_t seed = params.seed() ? *params.seed() : random_seed();
  // Refused now rather than after the wait: a field the pipeline class does not take, and, once the
  // pipeline is loaded, a size or a step count it cannot run.
  try {
    const PipelineRequest request = to_pipeline_request(params, seed);
    const PipelineClass& runs = class_for_job(*model->pipeline_class, request);
    runs.check_fields(request);
    if (const auto pipe = state.pool.loaded(model->id, &runs)) pipe->check_request(request);
  } catch (const RequestError& e) {
    // The pipeline names its own field ("height"); the client knows the JSON one ("size").
    const std::string field = json_field_of(e.field());
    throw ApiError(400, "invalid_request_error", field, (field.empty() ? "" : field + ": ") + e.what());
  }
  try {
    std::shared_ptr<Job> job = state.queue.submit(model->id, std::move(params), seed);
    state.metrics.job_submitted();
    return job;
  } catch (const QueueFull& e) {
    state.metrics.job_refused_queue_full();
    ApiError full(503, "server_error", "", e.what(), "queue_full");
    full.retry_after = e.retry_after();
    throw full;
  } catch (const ShuttingDown& e) {
    throw ApiError(503, "server_error", "", e.what(), "shutting_down");
  }
}

}  // namespace kiln::serve
