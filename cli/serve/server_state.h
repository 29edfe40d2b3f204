// What the HTTP routes of `kiln serve` share: the models, the jobs, the counters and the options.
#pragma once

#include <string>

#include "cli/serve/job_queue.h"
#include "cli/serve/metrics.h"
#include "cli/serve/model_pool.h"

namespace kiln::serve {

struct ServerState {
  ModelPool& pool;
  JobQueue& queue;
  Metrics& metrics;
  std::string api_key;  // empty: no key asked for (loopback only)
};

}  // namespace kiln::serve
