// Executables compiled from StableHLO text, cached per client by the text itself (which names the op, its
// shapes, dtypes and attributes): strict eager compiles each distinct op call once. KILN_LOG=compile reports
// every compile with its time, and the hits.
#pragma once

#include <memory>
#include <string>

#include "backends/pjrt/pjrt_client.h"

namespace kiln::pjrt {

// The executable for `module_text` on `client`, compiled on first use. `what` names the call in the log
// ("add(float32[2, 3], ...)").
std::shared_ptr<Executable> cached_executable(Client& client, const std::string& module_text,
                                              const std::string& what);

struct ExecutableCacheStats {
  int64_t compiles = 0;
  int64_t hits = 0;
};
ExecutableCacheStats executable_cache_stats();

}  // namespace kiln::pjrt
