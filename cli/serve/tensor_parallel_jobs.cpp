#include "cli/serve/tensor_parallel_jobs.h"

#include <cstdint>
#include <nlohmann/json.hpp>

#include "cli/serve/submit.h"
#include "kiln/dist/process_group.h"

namespace kiln::serve {

namespace {

using nlohmann::json;

// Its length first, then the bytes: every rank makes the same two broadcasts.
void broadcast_message(std::string& text) {
  uint64_t size = text.size();
  dist::broadcast_from_rank0(&size, sizeof size);
  text.resize(size);
  dist::broadcast_from_rank0(text.data(), size);
}

}  // namespace

void announce_job(const Job& job) {
  std::string message =
      json{{"model", job.model()}, {"params", to_json_text(job.params())}, {"seed", job.seed()}}.dump();
  broadcast_message(message);
}

void announce_stop() {
  std::string message = json{{"stop", true}}.dump();
  broadcast_message(message);
}

void follow_rank0(ModelPool& pool, const LoraLibrary& loras) {
  for (;;) {
    std::string message;
    broadcast_message(message);
    const json m = json::parse(message);
    if (m.contains("stop")) return;
    const std::string model = m.at("model").get<std::string>();
    const GenerationParams params = parse_generation_params(m.at("params").get<std::string>());
    try {
      const PipelineRequest request = to_pipeline_request(params, m.at("seed").get<uint64_t>());
      const std::shared_ptr<DiffusionPipeline> pipe =
          pool.acquire(model, &class_for_job(*pool.find(model)->pipeline_class, request));
      loras.use(*pipe, params.loras);  // the adapters rank 0 runs the job with
      (*pipe)(request);
    } catch (const Error&) {
      // Rank 0 reports it: the same job fails or is cancelled there.
    }
  }
}

}  // namespace kiln::serve
