// What `kiln generate` reads of a pipeline folder's weights, known from its files without loading them (for
// `kiln info`'s memory figures and offload plans). Most components read every tensor of their checkpoint;
// FLUX.2's text encoders read only what the pipelines' default text_encoder_out_layers need: the embedding
// and the layers up to the deepest one asked (FLUX.2-dev: 30 of Mistral Small 3.x's 40 layers, without its
// vision tower and lm_head; klein: 27 of Qwen3's 36, without lm_head).
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
