#include "pipelines/call_generators.h"

#include <string>

#include "pipelines/pipeline_common.h"

namespace kiln::pipelines {

CallGenerators::CallGenerators(const PipelineRequest& request)
    : single_(request.generator.value_or(Generator())),
      list_(request.generators),
      from_request_(request.generator.has_value()) {}

std::vector<Generator*> CallGenerators::pointers() {
  std::vector<Generator*> out;
  for (Generator& g : list_) out.push_back(&g);
  return out;
}

uint64_t CallGenerators::seed_of(size_t image) const {
  if (list_.empty()) return single_.initial_seed();
  return list_[image < list_.size() ? image : 0].initial_seed();
}

void CallGenerators::hand_back(PipelineOutput& output) const {
  if (list_.empty()) {
    if (from_request_) output.generator = single_;
    return;
  }
  output.generators = list_;
  for (size_t i = 0; i < output.images.size(); ++i)
    output.images[i].metadata["seed"] = std::to_string(seed_of(i));
}

void check_generators(const char* pipeline, const PipelineRequest& request) {
  if (request.generators.empty()) return;
  const std::string name = pipeline;
  refuse(request.generator.has_value(), "generators",
         name + ": give either generator or a list of generators, not both");
  const int64_t images = batch_size(request);
  // diffusers: a list of one generator is that generator.
  refuse(request.generators.size() != 1 && static_cast<int64_t>(request.generators.size()) != images,
         "generators",
         name + ": " + std::to_string(request.generators.size()) + " generators for " +
             std::to_string(images) + " images (one per image: prompts x num_images_per_prompt)");
}

}  // namespace kiln::pipelines
