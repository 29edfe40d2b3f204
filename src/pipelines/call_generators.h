// The random numbers of one pipeline call: the request's generator (torch's default seed when it has none),
// or its list of generators, one per image (diffusers' `generator=[...]`); and what they hold once the call
// has drawn from them, handed back in the output so that a caller's generator continues as torch's would.
#pragma once

#include <vector>

#include "kiln/pipelines/diffusion_pipeline.h"
#include "kiln/pipelines/generator.h"
#include "kiln/pipelines/pipeline_request.h"

namespace kiln::pipelines {

class CallGenerators {
 public:
  explicit CallGenerators(const PipelineRequest& request);

  // The generators randn_tensor draws the noise from: the list, or the one generator.
  std::vector<Generator*> noise() { return list_.empty() ? std::vector<Generator*>{&single_} : pointers(); }
  // The generator of draws that are not per image (the posterior sample of an input image).
  Generator& single() { return list_.empty() ? single_ : list_.front(); }
  // The seed an image's metadata names: the one generator's, or image i's own.
  uint64_t seed_of(size_t image) const;
  // Their states after the call's draws, into output.generator / output.generators, and each image's seed.
  void hand_back(PipelineOutput& output) const;

 private:
  std::vector<Generator*> pointers();

  Generator single_;
  std::vector<Generator> list_;
  bool from_request_ = false;
};

// The checks of `generators` (where the class takes them): one generator per image (or one), and `generator`
// then unset.
void check_generators(const char* pipeline, const PipelineRequest& request);

}  // namespace kiln::pipelines
