// What `kiln generate` reads of a pipeline folder's weights, known from its files without loading them (for
// `kiln info`'s memory figures and offload plans). Most components read every tensor of their checkpoint; a
// family may read less of one (Family::partial_weights: FLUX.2's text encoders read only the layers their
// hidden states need).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/io/model_summary.h"

namespace kiln {

struct LoadedWeights {
  std::vector<std::pair<std::string, int64_t>> tensors;  // (name, parameters), in the order registered
  int64_t parameters = 0;
  // How this differs from the checkpoint's tensors (empty when every tensor is read), e.g. "Kiln reads the
  // embedding and layers 0-29 of 40 (hidden states 10, 20, 30)".
  std::string note;
};

// `component` is one of `pipeline`'s components (summarize_model of a pipeline folder).
LoadedWeights loaded_weights(const io::ModelSummary& pipeline, const io::ComponentSummary& component);

}  // namespace kiln
