// What the HTTP routes of `kiln serve` share: the models, the jobs, the counters and the options.
#pragma once

#include <string>
#include <vector>

#include "cli/serve/job_queue.h"
#include "cli/serve/lora_library.h"
#include "cli/serve/metrics.h"
#include "cli/serve/model_pool.h"

namespace kiln::serve {

struct ServerState {
  ModelPool& pool;
  JobQueue& queue;
  Metrics& metrics;
  std::string api_key;  // empty: no key asked for (loopback only)
  // The devices this process's pipelines compute on besides the cpu (--device; each in-process rank's under
  // --tp), whose memory /metrics reports.
  std::vector<Device> devices;
  // The adapters requests may name (--lora-dir).
  const LoraLibrary* loras = nullptr;
};

}  // namespace kiln::serve
