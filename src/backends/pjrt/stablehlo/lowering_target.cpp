#include "backends/pjrt/stablehlo/lowering_target.h"

#include <cstdlib>

#include "kiln/core/error.h"

namespace kiln::pjrt::hlo {

LoweringTarget lowering_target(std::string_view platform) {
  LoweringTarget t;
  t.platform = std::string(platform);
  if (platform == "cuda") {
    const char* env = std::getenv("KILN_PJRT_FUSED_ATTENTION");
    const std::string value = env != nullptr ? env : "";
    KILN_CHECK(value.empty() || value == "0" || value == "1",
               "KILN_PJRT_FUSED_ATTENTION must be 0 (attention as plain ops) or 1 (the default: cuDNN fused "
               "attention on cuda), got '"
                   << value << "'");
    t.cudnn_attention = value != "0";
  }
  return t;
}

}  // namespace kiln::pjrt::hlo
