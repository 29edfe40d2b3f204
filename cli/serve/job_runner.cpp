#include "cli/serve/job_runner.h"

#include "cli/serve/submit.h"

namespace kiln::serve {

void run_job(Job& job, ModelPool& pool, Metrics& metrics, const LoraLibrary& loras,
             const std::function<void(const Job&)>& announce) {
  try {
    if (announce) {
      announce(job);
    } else if (job.cancel_token().cancelled()) {
      // A job cancelled while it waited for its turn does not load a model for nothing.
      throw Cancelled("cancelled before it started");
    }
    PipelineRequest request = to_pipeline_request(job.params(), job.seed());
    const ModelPool::Model& model = *pool.find(job.model());
    const std::shared_ptr<DiffusionPipeline> pipe =
        pool.acquire(job.model(), &class_for_job(*model.pipeline_class, request));
    loras.use(*pipe, job.params().loras);
    request.cancel = job.cancel_token();
    request.callback_on_step_end = [&](StepState& step) {
      job.stepped(step.step + 1, step.num_steps, step.seconds);
      metrics.step(step.seconds);
    };
    const PipelineOutput out = (*pipe)(request);
    std::vector<std::string> pngs;
    for (const Image& image : out.images) pngs.push_back(image.encode_png());
    job.succeeded(std::move(pngs));
  } catch (const Cancelled&) {
    job.cancelled();  // with the reason its canceller gave
  } catch (const RequestError& e) {
    job.failed({400, "invalid_request_error", json_field_of(e.field()), e.what()});
  } catch (const std::exception& e) {
    job.failed({500, "server_error", "", e.what()});
  }
}

}  // namespace kiln::serve
