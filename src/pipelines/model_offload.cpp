#include "pipelines/model_offload.h"

#include <chrono>
#include <cstdio>

#include "kiln/core/log.h"

namespace kiln::pipelines {

void release_after_use(std::initializer_list<std::pair<const char*, nn::Module*>> components) {
  for (const auto& [name, module] : components) {
    if (module == nullptr) continue;
    const auto start = std::chrono::steady_clock::now();
    const size_t bytes = module->release_weights();
    if (log_enabled("offload")) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      char line[160];
      std::snprintf(line, sizeof line, "%s: released %.2f GB of weights after use (%.0f ms)", name,
                    bytes / 1e9, ms);
      log("offload", line);
    }
  }
}

}  // namespace kiln::pipelines
