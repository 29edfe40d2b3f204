#include "kiln/pipelines/loaded_weights.h"

#include "kiln/pipelines/pipeline_registry.h"

namespace kiln {

LoadedWeights loaded_weights(const io::ModelSummary& pipeline, const io::ComponentSummary& component) {
  const PipelineClass* c = find_pipeline_class(pipeline.class_name);
  if (c != nullptr && c->family->partial_weights)
    if (std::optional<LoadedWeights> partial = c->family->partial_weights(component)) return *partial;
  LoadedWeights out;
  out.tensors = component.weights.tensor_parameters;
  out.parameters = component.weights.parameters;
  return out;
}

}  // namespace kiln
