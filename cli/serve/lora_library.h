// The LoRA adapters `kiln serve --lora-dir DIR` offers: DIR's .safetensors files, by name (the file name
// without its extension). A request asks for some with "loras": [{"name": ..., "scale": ...}]; its job runs
// with exactly those (unfused, at those scales) and the next job with its own: each adapter is loaded into a
// model's pipeline the first time a job asks for it and stays loaded, and switching adapters builds no
// program.
#pragma once

#include <string>
#include <vector>

#include "cli/serve/generation_params.h"
#include "kiln/pipelines/diffusion_pipeline.h"

namespace kiln::serve {

class LoraLibrary {
 public:
  // `dir` empty: no adapters offered (a request that asks for one is refused, saying how to offer them).
  // Throws kiln::Error when `dir` is given but is not a readable folder.
  explicit LoraLibrary(std::string dir = "");

  bool enabled() const { return !dir_.empty(); }
  // The names of the folder's adapters, sorted.
  std::vector<std::string> names() const;
  // Refuses (RequestError naming "loras") a choice of an adapter the folder does not hold.
  void check(const std::vector<LoraChoice>& loras) const;
  // Makes `pipe` run with exactly `loras`: loads those it has not loaded yet (named after their files) and
  // sets them active at their scales; none: every adapter inactive (the plain path, bit for bit). A file that
  // does not fit the model fails with RequestError naming "loras" and the file. The caller holds the model's
  // lane, so no other job uses `pipe` meanwhile.
  void use(DiffusionPipeline& pipe, const std::vector<LoraChoice>& loras) const;

 private:
  std::string path_of(const std::string& name) const;
  std::string dir_;
};

}  // namespace kiln::serve
