// Runs one job of `kiln serve` on its model's pipeline: the request its parameters describe, a step event
// per denoising step, the PNGs (with the parameters in text chunks, as `kiln generate` writes them) once it
// succeeds. Whatever goes wrong inside the job fails that job only.
#pragma once

#include <functional>

#include "cli/serve/job.h"
#include "cli/serve/lora_library.h"
#include "cli/serve/metrics.h"
#include "cli/serve/model_pool.h"

namespace kiln::serve {

// Runs it with the adapters it asked for (`loras`: --lora-dir), and no other. Leaves `job` succeeded, failed
// (400 naming the JSON field for a request the pipeline refused, 500 for anything else) or cancelled (its
// token set: by its client, by a DELETE, by the shutdown). `announce` (rank 0 under --tp:
// tensor_parallel_jobs.h) is called before the model is acquired; the pipeline is then called even for a job
// cancelled meanwhile, since the other ranks make the same call (the call stops at once, on every rank).
void run_job(Job& job, ModelPool& pool, Metrics& metrics, const LoraLibrary& loras,
             const std::function<void(const Job&)>& announce = {});

}  // namespace kiln::serve
